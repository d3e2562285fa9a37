package config

import (
	"fmt"
	"strings"

	"github.com/epochsketch/epochsketch/limit/clientip"
)

// ClientIPConfig says how the client's address is found: the address a
// key's "ip" part, the allow lists' cidrs and the per-client cap use.
type ClientIPConfig struct {
	// TrustedProxies are the CIDRs (or addresses) of proxies in front of
	// SketchProxy: load balancers, CDNs, the gateway that asks
	// forward_auth. Only when the connection comes from one of them is
	// Source read, from the right, skipping trusted hops: the first
	// untrusted address is the client. Without them the client is the
	// connection's peer.
	TrustedProxies []string `yaml:"trusted_proxies" example:"[10.0.0.0/24, 192.0.2.10]"`
	// Source is the one header the client address is read from:
	// "x-forwarded-for", "forwarded" (RFC 7239), "x-real-ip", or
	// "header:NAME" for a header the load balancer sets, such as
	// header:CF-Connecting-IP. Every other forwarding header is ignored:
	// read the one your load balancer overwrites or appends to. Behind
	// Traefik's forwardAuth keep x-forwarded-for: Traefik passes a
	// client's own Forwarded through (the client chooses its key), and
	// X-Real-Ip names Traefik for every client (they all share one key);
	// sketchproxy -check warns of both.
	Source string `yaml:"source" example:"header:CF-Connecting-IP"`
	// SetHeader names a header (e.g. X-Real-IP) that cmd/sketchproxy sets
	// on proxied requests to the client address it identified.
	SetHeader string `yaml:"set_header" example:"X-Real-IP"`
	// IPv6Prefix groups IPv6 clients by this prefix length, 1 to 128: at
	// 64, one subscriber's whole /64 is one client, whose "ip" key part is
	// written as the prefix (2001:db8::/64).
	IPv6Prefix int `yaml:"ipv6_prefix" example:"64"`
	// IPv4Prefix groups IPv4 clients by this prefix length, 1 to 32: at 32
	// each address is its own client, written as the address.
	IPv4Prefix int `yaml:"ipv4_prefix" example:"24"`
}

// Client address sources (ClientIPConfig.Source), besides "header:NAME".
const (
	SourceXFF       = "x-forwarded-for"
	SourceForwarded = "forwarded"
	SourceRealIP    = "x-real-ip"
)

// prepare applies the client_ip section's defaults, checks it, and
// compiles the trusted proxies into trusted.
func (cc *ClientIPConfig) prepare(c *Config, trusted *clientip.Trusted) error {
	for i, s := range cc.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			return c.errAt(err.Error(), "client_ip", "trusted_proxies", i)
		}
		trusted.Add(p)
	}
	if err := cc.prepareSource(c); err != nil {
		return err
	}
	return cc.preparePrefixes(c)
}

// prepareSource checks the header the address is read from and the one it
// is written to.
func (cc *ClientIPConfig) prepareSource(c *Config) error {
	cc.Source = strings.ToLower(strings.TrimSpace(cc.Source))
	switch name, isHeader := strings.CutPrefix(cc.Source, "header:"); {
	case cc.Source == "":
		cc.Source = SourceXFF
	case cc.Source == SourceXFF || cc.Source == SourceForwarded || cc.Source == SourceRealIP:
	case isHeader && validHeaderName(name):
	default:
		return c.errAt(fmt.Sprintf("%q: want x-forwarded-for, forwarded, x-real-ip or header:NAME", cc.Source), "client_ip", "source")
	}
	if cc.SetHeader != "" && !validHeaderName(cc.SetHeader) {
		return c.errAt(fmt.Sprintf("%q: not a header name", cc.SetHeader), "client_ip", "set_header")
	}
	return nil
}

// preparePrefixes applies the grouping's defaults and bounds.
func (cc *ClientIPConfig) preparePrefixes(c *Config) error {
	if cc.IPv6Prefix == 0 {
		cc.IPv6Prefix = 64
	}
	if cc.IPv4Prefix == 0 {
		cc.IPv4Prefix = 32
	}
	if cc.IPv6Prefix < 1 || cc.IPv6Prefix > 128 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 128", cc.IPv6Prefix), "client_ip", "ipv6_prefix")
	}
	if cc.IPv4Prefix < 1 || cc.IPv4Prefix > 32 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 32", cc.IPv4Prefix), "client_ip", "ipv4_prefix")
	}
	return nil
}
