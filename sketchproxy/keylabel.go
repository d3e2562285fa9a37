package sketchproxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
)

// keyLabel is a key as logs and metrics show it: "k:" and the first 12 hex
// digits of its HMAC-SHA256 under secret. A key is a client address, an API
// key or a token: none of them appears whole, and no byte a client chose
// reaches a log line or a label.
func keyLabel(secret []byte, key string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	var sum [32]byte
	return "k:" + hex.EncodeToString(mac.Sum(sum[:0])[:6])
}

// initRedaction picks the key of the hash that stands for keys in logs and
// metrics: key_label_secret_file's secret (fixed), else one from
// Options.Seed for repeatable tests, else one drawn at random.
func (m *Middleware) initRedaction(secret []byte) {
	switch {
	case secret != nil:
		m.redact = secret
	case m.opts.Seed != 0:
		var seed [8]byte
		binary.LittleEndian.PutUint64(seed[:], m.opts.Seed)
		sum := sha256.Sum256(seed[:])
		m.redact = sum[:]
	default:
		m.redact = make([]byte, 32)
		rand.Read(m.redact)
	}
}

// display is a key as this Middleware's logs and metrics show it. The same
// key shows the same way for the life of the process, so one client's lines
// and series can be followed; with key_label_secret_file, across restarts
// and replicas too.
func (m *Middleware) display(key string) string { return keyLabel(m.redact, key) }

// KeyLabel is the label that logs and metrics show for key under c's
// key_label_secret_file: "k:" and 12 hex digits. A key is what the rule's
// key parts build, joined with "|": see IPKey for an "ip" part. Without
// key_label_secret_file the labels are keyed at random at each start, and
// KeyLabel says so.
func (c *Config) KeyLabel(key string) (string, error) {
	_, b, err := c.prepared()
	if err != nil {
		return "", err
	}
	if b.labelKey == nil {
		return "", errors.New("key_label_secret_file is not set: the labels are keyed at random at each start; set it to compute a client's label")
	}
	return keyLabel(b.labelKey, key), nil
}

// IPKey is the key part "ip" for a client at addr: the address grouped by
// client_ip's prefixes (2001:db8::/64 for any address of that /64, by
// default).
func (c *Config) IPKey(addr netip.Addr) (string, error) {
	cp, _, err := c.prepared()
	if err != nil {
		return "", err
	}
	return cp.ClientIP.group(addr.Unmap()), nil
}
