package main

import (
	"fmt"
	"net/netip"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// exampleFlag is -example: alone it prints the full tour of every section,
// and -example minimal (or -example=minimal) the smallest deployable config.
type exampleFlag string

func (e *exampleFlag) String() string   { return string(*e) }
func (e *exampleFlag) IsBoolFlag() bool { return true }

func (e *exampleFlag) Set(v string) error {
	switch v {
	case "true", "full":
		*e = "full"
	case "false":
		*e = ""
	case "minimal":
		*e = "minimal"
	default:
		return fmt.Errorf("want -example (every section) or -example minimal, not %q", v)
	}
	return nil
}

// examples are what -example prints.
var examples = map[exampleFlag]string{
	"full":    sketchproxy.ExampleConfig,
	"minimal": sketchproxy.MinimalConfig,
}

// wideTrust4 and wideTrust6 are the prefix lengths from which a
// trusted-proxies range is warned about: a /8 (IPv4) or a /32 (IPv6) is a
// network of many hosts, each of which could then claim any client address
// in X-Forwarded-For.
const wideTrust4, wideTrust6 = 8, 32

// configWarnings are what a valid config may still get wrong: rules that
// can never refuse a request, and trusted-proxy ranges so wide that any
// host in them can pass for any client. -check prints them on standard
// error and still exits 0; a start logs them.
func configWarnings(cfg *sketchproxy.Config) []string {
	var ws []string
	for i, r := range cfg.Rules {
		if r.Shadow {
			ws = append(ws, fmt.Sprintf("rules[%d] (%s): shadow: true: it decides, logs and counts, but never refuses a request; remove shadow to enforce it", i, r.Name))
		}
	}
	for i, s := range cfg.ClientIP.TrustedProxies {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			continue // one address, not a range
		}
		if p.Addr().Is4() && p.Bits() <= wideTrust4 || !p.Addr().Is4() && p.Bits() <= wideTrust6 {
			ws = append(ws, fmt.Sprintf("client_ip.trusted_proxies[%d]: %s trusts every host in it to name the client in %s: any of them can pass for any client and escape every per-client limit; list your load balancers' addresses or their narrow subnet", i, s, cfg.ClientIP.Source))
		}
	}
	return append(ws, cfg.EnvoyRLS.Warnings()...)
}

// plural writes a count of things: "1 rule", "3 rules".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
