package config

import (
	"errors"
	"net/netip"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

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
	return engine.Label(b.labelKey, key), nil
}

// IPKey is the key part "ip" for a client at addr: the address grouped by
// client_ip's prefixes (2001:db8::/64 for any address of that /64, by
// default).
func (c *Config) IPKey(addr netip.Addr) (string, error) {
	b, err := Build(c)
	if err != nil {
		return "", err
	}
	if !addr.IsValid() {
		return "unknown", nil // as the doors key a client without an address
	}
	cc := &b.cfg.ClientIP
	return clientip.Key(addr.Unmap(), cc.IPv4Prefix, cc.IPv6Prefix), nil
}
