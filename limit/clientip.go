package limit

import (
	"fmt"
	"net/http"
	"net/netip"

	"github.com/epochsketch/epochsketch/limit/clientip"
)

// ClientIP returns a key function for Middleware: the address of the
// client as the proxies you trust saw it, grouped as the options say. It
// reads the request with package clientip, as SketchProxy's client_ip
// settings do (sketchproxy/README.md): the connection's peer is the client
// unless it is a trusted proxy (TrustProxies); then one forwarding header
// (X-Forwarded-For, or Forwarded with FromForwarded) is read from the
// right, past trusted proxies, and the first untrusted address is the
// client: what lies left of it was written by the client, who could choose
// any key there, and is never believed. A hop that does not parse
// ("unknown", an obfuscated name, garbage) ends the walk at the trusted
// proxy that reported it, as does the 64th hop; headers never fail a
// request. IPv4-mapped IPv6 addresses are IPv4; a zone (fe80::1%eth0) is
// dropped.
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
				p = netip.PrefixFrom(a, a.BitLen())
			}
			c.trusted.Add(p)
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
	trusted   clientip.Trusted
	unix      bool // a peer that is not an IP address is a trusted proxy
	forwarded bool // read Forwarded, not X-Forwarded-For
	v6bits    int
}

func (c *clientIP) key(r *http.Request) string {
	peer := clientip.ParseAddr(r.RemoteAddr)
	if !peer.IsValid() {
		if !c.unix {
			return RemoteIP(r)
		}
	} else if !c.trusted.Contains(peer) {
		return clientip.Key(peer, 32, c.v6bits)
	}
	name, f := "X-Forwarded-For", clientip.XForwardedFor
	if c.forwarded {
		name, f = "Forwarded", clientip.Forwarded
	}
	client := clientip.Walk(peer, r.Header.Values(name), f, c.trusted.Contains)
	if !client.IsValid() {
		return RemoteIP(r) // the walk ended at the trusted Unix socket's peer
	}
	return clientip.Key(client, 32, c.v6bits)
}
