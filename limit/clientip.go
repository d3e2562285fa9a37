package limit

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIP returns a key function for Middleware: the address of the
// client as the proxies you trust saw it, grouped as the options say. It
// reads the request as SketchProxy's client_ip settings do
// (sketchproxy/README.md): the connection's peer is the client unless it
// is a trusted proxy (TrustProxies); then one forwarding header
// (X-Forwarded-For, or Forwarded with FromForwarded) is read from the
// right, past trusted proxies, and the first untrusted address is the
// client: what lies left of it was written by the client, who could choose
// any key there, and is never believed. A hop that does not parse
// ("unknown", an obfuscated name, garbage) ends the walk at the trusted
// proxy that reported it, as does the 64th hop; headers never fail a
// request. IPv4-mapped IPv6 addresses are IPv4.
//
// The key is the address as netip.Addr.String writes it, or with
// IPv6Prefix the prefix ("2001:db8:1:2::/64"). A peer that is not an IP
// address and not trusted (a Unix socket without TrustProxies("unix")) is
// keyed as RemoteIP keys it. With no options ClientIP is RemoteIP, with
// addresses in netip's canonical form.
//
// ClientIP returns an error, naming the option and what to write instead,
// for an option it cannot use.
func ClientIP(opts ...IPOption) (func(*http.Request) string, error) {
	c := &clientIP{v6bits: 128}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(c); err != nil {
			return nil, err
		}
	}
	return c.key, nil
}

// IPOption configures ClientIP. A nil IPOption does nothing; an IPOption
// is a plain function value, safe to share. The key function ClientIP
// returns is safe for concurrent use.
type IPOption func(*clientIP) error

// TrustProxies names the proxies whose forwarding header ClientIP
// believes: addresses ("192.0.2.7", "::1") and CIDR prefixes
// ("10.0.0.0/8", "2001:db8::/32"), and "unix" for a peer on a Unix socket.
// Trust only the proxies in front of this server: a client that reaches
// it directly from a trusted range can write its own key.
func TrustProxies(proxies ...string) IPOption {
	return func(c *clientIP) error {
		for _, s := range proxies {
			if s == "unix" {
				c.unix = true
				continue
			}
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil || a.Zone() != "" {
					return fmt.Errorf("limit: TrustProxies: %q is not an IP address, a CIDR prefix or \"unix\": want 192.0.2.7, 10.0.0.0/8, 2001:db8::/32 or unix", s)
				}
				p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
			}
			if p.Addr().Is4In6() {
				p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
			}
			c.trusted = append(c.trusted, p.Masked())
		}
		return nil
	}
}

// FromForwarded makes ClientIP read the Forwarded field (RFC 7239, its
// for= parameters) instead of X-Forwarded-For. Only the one header is read:
// a client cannot pick its key by sending the other, which the proxy may
// pass through untouched.
func FromForwarded() IPOption {
	return func(c *clientIP) error {
		c.forwarded = true
		return nil
	}
}

// IPv6Prefix groups IPv6 clients by their first bits bits (1 to 128): 64
// makes each /64, which one subscriber or host usually holds whole, one
// key, so that a client cannot rotate through its prefix to multiply its
// limit. IPv4 addresses stay whole.
func IPv6Prefix(bits int) IPOption {
	return func(c *clientIP) error {
		if bits < 1 || bits > 128 {
			return fmt.Errorf("limit: IPv6Prefix(%d): want 1 to 128 bits (64 keys each /64 as one client)", bits)
		}
		c.v6bits = bits
		return nil
	}
}

// clientIP is ClientIP's configuration.
type clientIP struct {
	trusted   []netip.Prefix
	unix      bool // a peer that is not an IP address is a trusted proxy
	forwarded bool // read Forwarded, not X-Forwarded-For
	v6bits    int
}

// maxHops bounds the walk through a forwarding header, as SketchProxy's:
// no deployment has more proxies, and a header of commas costs nothing.
const maxHops = 64

func (c *clientIP) key(r *http.Request) string {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() {
		if !c.unix {
			return RemoteIP(r)
		}
	} else if !c.isTrusted(peer) {
		return c.group(peer)
	}
	client := peer
	name := "X-Forwarded-For"
	if c.forwarded {
		name = "Forwarded"
	}
	values := r.Header.Values(name)
	hops := 0
	// Right to left: the last field line first, and in each line the last
	// element first.
	for i := len(values) - 1; i >= 0; i-- {
		for v := values[i]; v != ""; {
			if hops++; hops > maxHops {
				return c.end(client, r)
			}
			elem := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				elem, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			if c.forwarded {
				elem = forwardedFor(elem)
			}
			a := parseHost(elem)
			if !a.IsValid() {
				return c.end(client, r)
			}
			client = a
			if !c.isTrusted(a) {
				return c.group(a)
			}
		}
	}
	return c.end(client, r)
}

// end is the key when the walk ends at a trusted hop: that hop's address,
// or RemoteIP's key when it is the Unix socket's peer.
func (c *clientIP) end(client netip.Addr, r *http.Request) string {
	if !client.IsValid() {
		return RemoteIP(r)
	}
	return c.group(client)
}

func (c *clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group is a's key: IPv6 by its prefix of v6bits, else a itself.
func (c *clientIP) group(a netip.Addr) string {
	if a.Is6() && c.v6bits < 128 {
		p, _ := a.WithZone("").Prefix(c.v6bits) // bits are 1 to 127: no error
		return p.String()
	}
	return a.String()
}

// parseHost reads "1.2.3.4", "1.2.3.4:80", "[::1]:80", "::1", or a
// Forwarded node ("[2001:db8::1]:4711", quoted). IPv4-mapped IPv6 becomes
// IPv4. An invalid Addr means it did not parse.
func parseHost(s string) netip.Addr {
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
// (for=192.0.2.60;proto=http;by=203.0.113.43), or "" if it has none, which
// ends the walk.
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
