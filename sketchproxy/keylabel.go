package sketchproxy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

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
func (m *Middleware) display(key string) string { return config.Label(m.redact, key) }

// keyLabelOf is the label logs and metrics show for a verdict's key: an
// Envoy descriptor's values as sent (rls.KeyValues), an HTTP rule's key,
// under the keyed hash, so that sketchproxy -key-label computes both.
func (m *Middleware) keyLabelOf(v *verdict) string {
	if v.Rule != nil && rls.IsRule(v.Rule.Name) {
		return m.display(rls.KeyValues(v.Key))
	}
	return m.display(v.Key)
}
