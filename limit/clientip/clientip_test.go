package clientip_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/epochsketch/epochsketch/limit/clientip"
)

// trusted are the proxies of the tests: ranges, single addresses of both
// families, and a link-local proxy that its peers see with a zone.
func trusted(t testing.TB) *clientip.Trusted {
	t.Helper()
	var tr clientip.Trusted
	for _, s := range []string{"10.0.0.0/8", "192.0.2.7/32", "::1/128", "2001:db8:ffff::/48", "fe80::1/128"} {
		tr.Add(netip.MustParsePrefix(s))
	}
	return &tr
}

// client is what the users of the package do with a request from remote:
// the peer unless it is a trusted proxy, else the walk of values from it.
func client(tr *clientip.Trusted, remote string, values []string, f clientip.Format) netip.Addr {
	peer := clientip.ParseAddr(remote)
	if !peer.IsValid() || !tr.Contains(peer) {
		return peer
	}
	return clientip.Walk(peer, values, f, tr.Contains)
}

// TestWalk: the right-most untrusted address of the one header read, past
// trusted proxies; what a client writes left of it is never believed, and
// a hop that does not parse ends the walk at the proxy that reported it.
// The cases of package limit's and SketchProxy's parsers before they were
// this one, and the cases where they differed (zones) or had none.
func TestWalk(t *testing.T) {
	const xff, fwd = clientip.XForwardedFor, clientip.Forwarded
	for _, tc := range []struct {
		name   string
		f      clientip.Format
		remote string
		values []string
		want   string // "" for the invalid Addr
	}{
		{"untrusted peer: its header ignored", xff, "203.0.113.9:1", []string{"198.51.100.1"}, "203.0.113.9"},
		{"one trusted proxy", xff, "10.1.2.3:1", []string{"198.51.100.1"}, "198.51.100.1"},
		{"a spoofed left part", xff, "10.1.2.3:1", []string{"6.6.6.6, 198.51.100.1"}, "198.51.100.1"},
		{"a spoofed left part, a trusted hop", xff, "10.0.0.2:80", []string{"6.6.6.6, 198.51.100.9, 10.1.1.1"}, "198.51.100.9"},
		{"a chain of trusted proxies", xff, "10.1.2.3:1", []string{"198.51.100.1, 192.0.2.7, 10.9.9.9"}, "198.51.100.1"},
		{"all trusted: the leftmost", xff, "10.0.0.2:80", []string{"10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"several field lines, the last first", xff, "[::1]:1", []string{"6.6.6.6, 198.51.100.1", "10.0.0.1"}, "198.51.100.1"},
		{"a hop that does not parse", xff, "10.1.2.3:1", []string{"198.51.100.1, unknown, 10.0.0.2"}, "10.0.0.2"},
		{"garbage", xff, "10.1.2.3:1", []string{"198.51.100.9, not-an-ip, 10.1.1.1"}, "10.1.1.1"},
		{"an obfuscated identifier", xff, "10.1.2.3:1", []string{"198.51.100.9, _hidden"}, "10.1.2.3"},
		{"an empty element", xff, "10.1.2.3:1", []string{"198.51.100.1, , 10.0.0.2"}, "10.0.0.2"},
		{"a trailing comma", xff, "10.1.2.3:1", []string{"198.51.100.1,"}, "10.1.2.3"},
		{"commas only", xff, "10.1.2.3:1", []string{",,, ,zz", "unknown"}, "10.1.2.3"},
		{"no header", xff, "10.1.2.3:1", nil, "10.1.2.3"},
		{"an empty header", xff, "10.1.2.3:1", []string{""}, "10.1.2.3"},
		{"a peer without a port", xff, "10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"ports and mapped addresses", xff, "[::ffff:10.1.2.3]:1", []string{"198.51.100.1:4711"}, "198.51.100.1"},
		{"a mapped hop", xff, "10.1.2.3:1", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		{"a mapped hop, trusted as IPv4", xff, "10.1.2.3:1", []string{"198.51.100.1, ::ffff:10.0.0.2"}, "198.51.100.1"},
		{"a quoted hop", xff, "10.1.2.3:1", []string{`"198.51.100.1"`}, "198.51.100.1"},
		{"a bracketed hop", xff, "10.1.2.3:1", []string{"[2001:db8::9]"}, "2001:db8::9"},
		{"a bracketed hop with a port", xff, "10.1.2.3:1", []string{"[2001:db8::9]:443"}, "2001:db8::9"},
		{"an unbalanced quote", xff, "10.1.2.3:1", []string{`"198.51.100.1`}, "10.1.2.3"},
		{"a trusted IPv6 proxy", xff, "[2001:db8:ffff::1]:443", []string{"2001:db8:aaaa:bbbb::1"}, "2001:db8:aaaa:bbbb::1"},
		// Zones name the receiving interface: dropped, so that a
		// link-local proxy is trusted by its address (SketchProxy kept
		// the zone of a peer and of a hop with a port, and so trusted
		// neither, and refused a hop without a port).
		{"a zoned trusted peer", xff, "[fe80::1%eth0]:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"a zoned hop", xff, "10.1.2.3:1", []string{"fe80::2%eth1"}, "fe80::2"},
		{"a zoned hop with a port", xff, "10.1.2.3:1", []string{"[fe80::2%eth1]:4711"}, "fe80::2"},
		{"a zoned trusted hop", xff, "10.1.2.3:1", []string{"198.51.100.1, fe80::1%eth0"}, "198.51.100.1"},
		{"a zoned untrusted peer", xff, "[fe80::2%eth0]:80", []string{"198.51.100.1"}, "fe80::2"},
		{"a peer that is no address", xff, "pipe", []string{"198.51.100.1"}, ""},
		{"a Unix socket's peer", xff, "@", nil, ""},

		{"Forwarded", fwd, "10.0.0.2:80", []string{"for=192.0.2.60;proto=http;by=10.0.0.2"}, "192.0.2.60"},
		{"Forwarded IPv6 with a port", fwd, "10.0.0.2:80", []string{`for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::17"},
		{"Forwarded, a spoofed left part", fwd, "10.0.0.2:80", []string{"for=6.6.6.6, for=198.51.100.1, for=10.2.2.2"}, "198.51.100.1"},
		{"Forwarded, parameters after for", fwd, "10.1.2.3:1", []string{`for=6.6.6.6, for="[2001:db8:1:2:3::9]:4711";proto=https`}, "2001:db8:1:2:3::9"},
		{"Forwarded, FOR and spaces", fwd, "10.1.2.3:1", []string{`proto=http ; FOR="198.51.100.1:80"`}, "198.51.100.1"},
		{"Forwarded unknown", fwd, "10.0.0.2:80", []string{"for=unknown"}, "10.0.0.2"},
		{"Forwarded, an obfuscated identifier", fwd, "10.0.0.2:80", []string{`for=198.51.100.1, for="_gazonk"`}, "10.0.0.2"},
		{"Forwarded, an element without for", fwd, "10.0.0.2:80", []string{"proto=https"}, "10.0.0.2"},
		{"Forwarded, the last element without for", fwd, "10.1.2.3:1", []string{"for=198.51.100.1, proto=http"}, "10.1.2.3"},
		{"Forwarded, an empty for", fwd, "10.1.2.3:1", []string{"for=198.51.100.1, for="}, "10.1.2.3"},
		{"X-Forwarded-For read as Forwarded", fwd, "10.1.2.3:1", []string{"198.51.100.1"}, "10.1.2.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want netip.Addr
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got := client(trusted(t), tc.remote, tc.values, tc.f); got != want {
				t.Fatalf("%q from %s: %v, want %v", tc.values, tc.remote, got, want)
			}
		})
	}
}

// TestWalkMaxHops: the walk reads 64 hops and ends at the 65th, at the
// trusted proxy that reported it.
func TestWalkMaxHops(t *testing.T) {
	tr := trusted(t)
	for _, tc := range []struct {
		trustedHops int
		want        string
	}{
		{63, "198.51.100.1"}, // the client is the 64th hop
		{64, "10.0.0.2"},     // the client would be the 65th
	} {
		v := "198.51.100.1" + strings.Repeat(", 10.0.0.2", tc.trustedHops)
		if got := client(tr, "10.0.0.1:1", []string{v}, clientip.XForwardedFor); got.String() != tc.want {
			t.Errorf("%d trusted hops: %v, want %s", tc.trustedHops, got, tc.want)
		}
	}
}

// TestTrusted: a prefix trusts its addresses whatever form it is written
// in; an IPv4-mapped one trusts the IPv4 addresses it maps, since
// ParseAddr reads mapped addresses as IPv4.
func TestTrusted(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		in     []string
		out    []string
	}{
		{"10.1.2.3/8", []string{"10.0.0.1", "10.255.0.1"}, []string{"11.0.0.1", "::ffff:10.0.0.1"}},
		{"::ffff:10.0.0.0/104", []string{"10.0.0.1", "10.9.9.9"}, []string{"11.0.0.1"}},
		{"::ffff:192.0.2.7/128", []string{"192.0.2.7"}, []string{"192.0.2.8"}},
		{"2001:db8::/32", []string{"2001:db8::1"}, []string{"2001:db9::1", "10.0.0.1"}},
	} {
		var tr clientip.Trusted
		tr.Add(netip.MustParsePrefix(tc.prefix))
		for _, s := range tc.in {
			if !tr.Contains(clientip.ParseAddr(s)) {
				t.Errorf("%s does not trust %s", tc.prefix, s)
			}
		}
		for _, s := range tc.out {
			if tr.Contains(netip.MustParseAddr(s)) {
				t.Errorf("%s trusts %s", tc.prefix, s)
			}
		}
	}
	var none clientip.Trusted
	if none.Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Error("the zero Trusted trusts 10.0.0.1")
	}
}

// TestKey: IPv6 by its prefix, IPv4 by its own, a group of one written as
// the address.
func TestKey(t *testing.T) {
	for _, tc := range []struct {
		addr           string
		v4bits, v6bits int
		want           string
	}{
		{"2001:db8:1:2:3:4:5:6", 32, 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 32, 128, "2001:db8:1:2:3:4:5:6"},
		{"2001:db8:1:2:3:4:5:6", 32, 48, "2001:db8:1::/48"},
		{"fe80::1%eth0", 32, 128, "fe80::1"},
		{"fe80::1%eth0", 32, 64, "fe80::/64"},
		{"203.0.113.9", 32, 64, "203.0.113.9"},
		{"203.0.113.9", 24, 64, "203.0.113.0/24"},
		{"203.0.113.9", 0, 64, "203.0.113.9"}, // bits out of range: whole
	} {
		if got := clientip.Key(netip.MustParseAddr(tc.addr), tc.v4bits, tc.v6bits); got != tc.want {
			t.Errorf("Key(%s, %d, %d) = %q, want %q", tc.addr, tc.v4bits, tc.v6bits, got, tc.want)
		}
	}
	if got := clientip.Key(netip.Addr{}, 32, 64); got != "invalid IP" {
		t.Errorf("Key of the invalid Addr = %q", got)
	}
}

// FuzzWalk: whatever the headers, the client is the peer unless the peer
// is trusted, and then the peer or an address the header names with only
// trusted proxies to its right.
func FuzzWalk(f *testing.F) {
	for _, s := range []struct{ remote, v1, v2 string }{
		{"10.0.0.1:80", "198.51.100.9, 10.1.1.1", ""},
		{"10.0.0.1:80", "6.6.6.6, 198.51.100.9", "10.2.2.2"},
		{"203.0.113.9:1", "1.1.1.1", ""},
		{"[2001:db8:ffff::1]:443", `for="[2001:db8::1]:4711";proto=https, for=10.0.0.3`, ""},
		{"[fe80::1%eth0]:80", "fe80::2%eth0, fe80::1%eth1", ""},
		{"10.0.0.1:80", ",,, ,zz", "unknown"},
		{"10.0.0.1:80", strings.Repeat("10.0.0.9,", 100), ""},
	} {
		for fm := range 2 {
			f.Add(s.remote, s.v1, s.v2, uint8(fm))
		}
	}
	tr := trusted(f)
	f.Fuzz(func(t *testing.T, remote, v1, v2 string, fm uint8) {
		format := clientip.Format(fm % 2)
		var values []string
		for _, v := range []string{v1, v2} {
			if v != "" {
				values = append(values, v)
			}
		}
		got := client(tr, remote, values, format)
		peer := clientip.ParseAddr(remote)
		if !peer.IsValid() || !tr.Contains(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: client %v", remote, got)
			}
			return
		}
		if got == peer {
			return
		}
		// got is named in the header, and every hop right of it is trusted.
		var hops []netip.Addr
		for _, v := range values {
			for _, e := range strings.Split(v, ",") {
				if format == clientip.Forwarded {
					e = forFor(e)
				}
				hops = append(hops, clientip.ParseAddr(e))
			}
		}
		for i := len(hops) - 1; i >= 0; i-- {
			if hops[i] == got {
				return
			}
			if !hops[i].IsValid() || !tr.Contains(hops[i]) {
				t.Fatalf("client %v, but hop %v right of it is not a trusted proxy (%q, %q)", got, hops[i], v1, v2)
			}
		}
		t.Fatalf("client %v is not in the header (%q, %q)", got, v1, v2)
	})
}

// forFor is the first for= value of a Forwarded element, read apart from
// the package's own reading.
func forFor(e string) string {
	for _, p := range strings.Split(e, ";") {
		if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "for") {
			return v
		}
	}
	return ""
}
