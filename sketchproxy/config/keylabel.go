package config

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/netip"
)

// Label is a key as logs and metrics show it: "k:" and the first 12 hex
// digits of its HMAC-SHA256 under secret. A key is a client address, an API
// key or a token: none of them appears whole, and no byte a client chose
// reaches a log line or a label.
func Label(secret []byte, key string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	var sum [32]byte
	return "k:" + hex.EncodeToString(mac.Sum(sum[:0])[:6])
}

// KeyLabel is the label that logs and metrics show for key under c's
// key_label_secret_file: "k:" and 12 hex digits. A key is what the rule's
// key parts build, joined with "|": see IPKey for an "ip" part. Without
// key_label_secret_file the labels are keyed at random at each start, and
// KeyLabel says so.
func (c *Config) KeyLabel(key string) (string, error) {
	b, err := Build(c)
	if err != nil {
		return "", err
	}
	if b.labelKey == nil {
		return "", errors.New("key_label_secret_file is not set: the labels are keyed at random at each start; set it to compute a client's label")
	}
	return Label(b.labelKey, key), nil
}

// IPKey is the key part "ip" for a client at addr: the address grouped by
// client_ip's prefixes (2001:db8::/64 for any address of that /64, by
// default).
func (c *Config) IPKey(addr netip.Addr) (string, error) {
	b, err := Build(c)
	if err != nil {
		return "", err
	}
	return b.cfg.ClientIP.Group(addr.Unmap()), nil
}
