package sketchproxy

import (
	"fmt"
	"strings"
)

// ClientIPConfig says how the client's address is found.
type ClientIPConfig struct {
	// TrustedProxies are the CIDRs of proxies in front of SketchProxy (load
	// balancers, CDNs). Only when the connection comes from one of them is
	// Source read, from the right, skipping trusted hops: the first
	// untrusted address is the client.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Source is the one header the client address is read from:
	// "x-forwarded-for" (the default), "forwarded" (RFC 7239),
	// "x-real-ip", or "header:NAME" for a header the load balancer sets,
	// such as header:CF-Connecting-IP. Every other forwarding header is
	// ignored: read the one your load balancer overwrites or appends to.
	Source string `yaml:"source"`
	// SetHeader names a header (e.g. X-Real-IP) that cmd/sketchproxy sets
	// on proxied requests to the client address it identified.
	SetHeader string `yaml:"set_header"`
	// IPv6Prefix groups IPv6 clients by this prefix length (default 64: one
	// subscriber's whole /64 is one client). IPv4Prefix likewise (default 32).
	IPv6Prefix int `yaml:"ipv6_prefix"`
	IPv4Prefix int `yaml:"ipv4_prefix"`
}

// prepare applies the client_ip section's defaults, checks it, and
// compiles the trusted proxies into ci.
func (cc *ClientIPConfig) prepare(c *Config, ci *clientIP) error {
	ci.ClientIPConfig = cc
	for i, s := range cc.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			return c.errAt(err.Error(), "client_ip", "trusted_proxies", i)
		}
		ci.trusted = append(ci.trusted, p)
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
		cc.Source = sourceXFF
	case cc.Source == sourceXFF || cc.Source == sourceForwarded || cc.Source == sourceRealIP:
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
