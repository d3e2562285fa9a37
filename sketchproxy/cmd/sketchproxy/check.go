package main

import (
	"fmt"
	"io"
	"net/http"
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
// can never refuse a request, trusted-proxy ranges so wide that any host in
// them can pass for any client, forward_auth settings that the named
// gateway breaks, and a fleet that cannot know its size while Redis is
// down. -check prints them on standard error and still exits 0;
// a start logs them.
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
	ws = append(ws, gatewayWarnings(cfg)...)
	if w := sketchproxy.FleetSizeWarning(cfg); w != "" {
		ws = append(ws, w)
	}
	return append(ws, cfg.EnvoyRLS.Warnings()...)
}

// gatewayWarnings are forward_auth settings that docs/forward-auth.md
// (its table of gateways) calls broken or unsafe with the gateway named: a
// refusal status nginx's auth_request turns into 500, a client address
// Traefik lets the client choose, or names Traefik by, and a client
// address nginx and Caddy pass on from the client unless their config
// replaces the header.
func gatewayWarnings(cfg *sketchproxy.Config) []string {
	fa := cfg.ForwardAuth
	if fa == nil {
		return nil
	}
	var ws []string
	passedThrough := func(gw, replace string) {
		if src := cfg.ClientIP.Source; src == "forwarded" || src == "x-real-ip" {
			ws = append(ws, fmt.Sprintf("client_ip.source: %s with gateway %s: %s passes a client's own %s header to the check unless %s replaces it, so each client can choose its key and escape every per-client limit; use source: x-forwarded-for (docs/forward-auth.md)",
				src, gw, map[string]string{"nginx": "nginx", "caddy": "Caddy"}[gw], map[string]string{"forwarded": "Forwarded", "x-real-ip": "X-Real-IP"}[src], replace))
		}
	}
	switch fa.Gateway {
	case "nginx":
		if fa.RefusalStatus != http.StatusUnauthorized && fa.RefusalStatus != http.StatusForbidden {
			ws = append(ws, fmt.Sprintf("forward_auth.refusal_status: %d with gateway nginx: auth_request accepts only 2xx, 401 and 403 from the check and answers the client 500 for anything else, so every refusal becomes a 500; set refusal_status: 403 and map it back to 429 with error_page (docs/nginx.md)", fa.RefusalStatus))
		}
		passedThrough("nginx", "the auth location's proxy_set_header")
	case "caddy":
		passedThrough("caddy", "the forward_auth block's header_up")
	case "traefik":
		switch cfg.ClientIP.Source {
		case "forwarded":
			ws = append(ws, "client_ip.source: forwarded with gateway traefik: Traefik passes a client's own Forwarded header to the check, so each client chooses its key and escapes every per-client limit; use source: x-forwarded-for")
		case "x-real-ip":
			ws = append(ws, "client_ip.source: x-real-ip with gateway traefik: X-Real-Ip names Traefik, not the client, so every client shares one key and one limit; use source: x-forwarded-for")
		}
	}
	return ws
}

// printKeyLabels is -key-label: the label of value as a whole key, and,
// for a client address, first the label of its ip key part (the address
// grouped by client_ip's prefixes), one "LABEL KEY" line each.
func printKeyLabels(cfg *sketchproxy.Config, value string, stdout, stderr io.Writer) int {
	keys := []string{value}
	if addr, err := netip.ParseAddr(value); err == nil {
		if k, err := cfg.IPKey(addr); err == nil && k != value {
			keys = []string{k, value}
		}
	}
	for _, k := range keys {
		label, err := cfg.KeyLabel(k)
		if err != nil {
			fmt.Fprintf(stderr, "sketchproxy: -key-label: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s %s\n", label, k)
	}
	return 0
}

// plural writes a count of things: "1 rule", "3 rules".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
