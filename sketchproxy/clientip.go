package sketchproxy

import (
	"net/http"
	"net/netip"
	"strings"
)

// clientAddr finds the client's address. The connection's peer is the
// client unless it is a trusted proxy; then the forwarding headers are read
// from the right, skipping trusted hops, and the first untrusted address is
// the client (the left part of X-Forwarded-For is whatever the client wrote).
// Forwarded (RFC 7239) is read if present, else X-Forwarded-For. A hop that
// does not parse ("unknown", an obfuscated name, garbage) ends the walk at
// the trusted proxy that reported it: headers never fail a request.
func (ci *ClientIPConfig) clientAddr(r *http.Request) netip.Addr {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() || !ci.isTrusted(peer) {
		return peer
	}
	var hops []string
	if fw := r.Header.Values("Forwarded"); len(fw) > 0 {
		hops = forwardedFor(fw)
	} else {
		for _, v := range r.Header.Values("X-Forwarded-For") {
			for _, h := range strings.Split(v, ",") {
				hops = append(hops, strings.TrimSpace(h))
			}
		}
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a := parseHost(hops[i])
		if !a.IsValid() {
			return client
		}
		client = a
		if !ci.isTrusted(a) {
			return a
		}
	}
	return client
}

func (ci *ClientIPConfig) isTrusted(a netip.Addr) bool {
	for _, p := range ci.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group maps an address to its client key: IPv6 by /64 (by default), IPv4
// by /32.
func (ci *ClientIPConfig) group(a netip.Addr) string {
	if !a.IsValid() {
		return "unknown"
	}
	bits := ci.IPv4Prefix
	if a.Is6() {
		bits = ci.IPv6Prefix
	}
	if bits >= a.BitLen() {
		return a.String()
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a.String()
	}
	return p.String()
}

// parseHost reads "1.2.3.4", "1.2.3.4:80", "[::1]:80", "::1", or a
// Forwarded node ("[2001:db8::1]:4711", quoted). IPv4-mapped IPv6 becomes
// IPv4. An invalid Addr means it did not parse.
func parseHost(s string) netip.Addr {
	s = strings.Trim(strings.TrimSpace(s), `"`)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap()
	}
	return netip.Addr{}
}

// forwardedFor lists the for= nodes of Forwarded headers, in order.
func forwardedFor(values []string) []string {
	var out []string
	for _, v := range values {
		for _, elem := range strings.Split(v, ",") {
			node := ""
			for _, pair := range strings.Split(elem, ";") {
				k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
				if ok && strings.EqualFold(k, "for") {
					node = val
				}
			}
			out = append(out, node) // an element without for= ends the walk
		}
	}
	return out
}
