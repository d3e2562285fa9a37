// Package clientip finds a request's client behind the proxies a server
// trusts, as package limit (ClientIP), its gRPC interceptors (limit/grpclimit)
// and SketchProxy (client_ip) read it: one parser, so that a header that one
// of them refuses to believe none of them believes.
//
// The rule: the connection's peer is the client unless it is a trusted
// proxy; then one forwarding header is read from the right, past trusted
// proxies, and the first untrusted address is the client. What lies left of
// it was written by the client, who could choose any key there, and is never
// believed. Walk reads the header; ParseAddr reads one address; Trusted holds
// the proxies; Key writes an address as a rate-limit key, grouped by prefix.
package clientip

import (
	"net/netip"
	"strings"
)

// Format is how a forwarding header lists its hops, left to right, each
// proxy appending the address it received the request from.
type Format uint8

const (
	// XForwardedFor: addresses separated by commas (X-Forwarded-For; a
	// header of one address, such as X-Real-IP or CF-Connecting-IP, reads
	// as a list of one).
	XForwardedFor Format = iota
	// Forwarded: RFC 7239 elements separated by commas; the address is an
	// element's for= parameter.
	Forwarded
)

// MaxHops bounds the walk through a forwarding header: no deployment has
// more proxies, and a header of 64 KiB of commas then costs nothing.
const MaxHops = 64

// Walk returns the client's address behind proxy, a trusted proxy that sent
// values, the field lines of one forwarding header in the order they came.
// It reads the hops right to left, the last line first: each trusted hop
// reported the one left of it, and the first untrusted hop is the client.
// A hop that does not parse ("unknown", an obfuscated identifier such as
// _hidden, an empty element, a Forwarded element without for=, garbage)
// ends the walk at the trusted proxy that reported it, as does the MaxHops
// hop: a client never gets past a proxy by writing something it cannot
// read. The result is that proxy when every hop read is trusted; it is
// proxy itself, which may be the invalid Addr (a trusted Unix socket's
// peer), when values name no hop. Headers never fail a request.
func Walk(proxy netip.Addr, values []string, f Format, trusted func(netip.Addr) bool) netip.Addr {
	client := proxy
	hops := 0
	for i := len(values) - 1; i >= 0; i-- {
		for v := values[i]; v != ""; {
			if hops++; hops > MaxHops {
				return client
			}
			elem := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				elem, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			if f == Forwarded {
				elem = forwardedFor(elem)
			}
			a := ParseAddr(elem)
			if !a.IsValid() {
				return client
			}
			client = a
			if !trusted(a) {
				return a
			}
		}
	}
	return client
}

// ParseAddr reads an address as a peer (http.Request.RemoteAddr) or a hop
// writes it: "192.0.2.1", "192.0.2.1:80", "2001:db8::1", "[2001:db8::1]",
// "[2001:db8::1]:443", each optionally quoted as a Forwarded node is, with
// space around. An IPv4-mapped IPv6 address is the IPv4 address, so that a
// dual-stack listener keys a client as an IPv4 one does. A zone
// (fe80::1%eth0) is dropped: it names the interface that received the
// request, not the client, and a trusted proxy on a link-local address is
// trusted by its address. Anything else is the invalid Addr.
func ParseAddr(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap()
	}
	if len(s) >= 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap()
	}
	return netip.Addr{}
}

// forwardedFor is the for= node of one Forwarded element
// (for=192.0.2.60;proto=http;by=203.0.113.43), or "" if it has none.
func forwardedFor(elem string) string {
	for elem != "" {
		pair := elem
		if j := strings.IndexByte(elem, ';'); j >= 0 {
			pair, elem = elem[:j], elem[j+1:]
		} else {
			elem = ""
		}
		k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, "for") {
			return val
		}
	}
	return ""
}

// Trusted is a set of trusted proxies. The zero value trusts none. Add
// before use; Contains is then safe for concurrent use.
type Trusted struct {
	prefixes []netip.Prefix
}

// Add trusts the addresses of p. An IPv4-mapped IPv6 prefix
// (::ffff:10.0.0.0/104) trusts the IPv4 addresses it maps, since ParseAddr
// reads every mapped address as IPv4; a zone is dropped, as ParseAddr drops
// it.
func (t *Trusted) Add(p netip.Prefix) {
	a := p.Addr().WithZone("")
	bits := p.Bits()
	if a.Is4In6() {
		a, bits = a.Unmap(), max(0, bits-96)
	}
	t.prefixes = append(t.prefixes, netip.PrefixFrom(a, bits).Masked())
}

// Contains reports whether a is a trusted proxy.
func (t *Trusted) Contains(a netip.Addr) bool {
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Key writes a as a rate-limit key: an IPv4 address grouped by its first
// v4bits bits (1 to 32), an IPv6 address by its first v6bits (1 to 128),
// so that a client cannot multiply its limit by rotating through the
// prefix it holds (at 64, one subscriber's or host's /64). A group of one
// address is written as the address ("192.0.2.1"), a larger one as its
// prefix ("2001:db8:1:2::/64"); a zone is dropped. Bits out of range keep
// the address whole; the invalid Addr is "invalid IP", as netip writes it.
func Key(a netip.Addr, v4bits, v6bits int) string {
	bits := v4bits
	if a.Is6() {
		bits = v6bits
	}
	a = a.WithZone("")
	if bits < 1 || bits >= a.BitLen() {
		return a.String()
	}
	p, _ := a.Prefix(bits) // bits are 1 to BitLen-1: no error
	return p.String()
}
