package sketchproxy

import (
	"net/http/httptest"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

func TestClientAddr(t *testing.T) {
	for _, c := range []struct {
		name   string
		source string
		remote string
		hdr    map[string]string
		want   string
	}{
		{"direct", "", "203.0.113.7:5555", nil, "203.0.113.7"},
		{"untrusted peer's XFF ignored", "", "203.0.113.7:5555", map[string]string{"X-Forwarded-For": "1.1.1.1"}, "203.0.113.7"},
		{"trusted peer, XFF", "", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		{"spoofed left part", "", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "6.6.6.6, 198.51.100.9, 10.1.1.1"}, "198.51.100.9"},
		{"all trusted: the leftmost", "", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "10.9.9.9, 10.1.1.1"}, "10.9.9.9"},
		{"garbage hop ends the walk at its reporter", "", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "198.51.100.9, not-an-ip, 10.1.1.1"}, "10.1.1.1"},
		{"empty XFF", "", "10.0.0.2:80", map[string]string{"X-Forwarded-For": ""}, "10.0.0.2"},
		// The issue this guards: a client that rotates a header the load
		// balancer does not touch must not pick its key.
		{"Forwarded ignored when the source is XFF", "", "10.0.0.2:80", map[string]string{"Forwarded": `for=6.6.6.6`, "X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		{"X-Real-IP ignored when the source is XFF", "", "10.0.0.2:80", map[string]string{"X-Real-Ip": `6.6.6.6`, "X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		{"Forwarded as the source", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `for=192.0.2.60;proto=http;by=10.0.0.2`, "X-Forwarded-For": "6.6.6.6"}, "192.0.2.60"},
		{"Forwarded IPv6 with port", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `for="[2001:db8:cafe::17]:4711"`}, "2001:db8:cafe::/64"},
		{"Forwarded list, spoofed left", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `for=6.6.6.6, for=198.51.100.1, for=10.2.2.2`}, "198.51.100.1"},
		{"Forwarded unknown", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `for=unknown`}, "10.0.0.2"},
		{"Forwarded element without for", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `proto=https`}, "10.0.0.2"},
		{"XFF ignored when the source is Forwarded", "forwarded", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "6.6.6.6"}, "10.0.0.2"},
		{"X-Real-IP as the source", "x-real-ip", "10.0.0.2:80", map[string]string{"X-Real-IP": "198.51.100.4", "X-Forwarded-For": "6.6.6.6"}, "198.51.100.4"},
		{"X-Real-IP from an untrusted peer", "x-real-ip", "203.0.113.7:80", map[string]string{"X-Real-IP": "198.51.100.4"}, "203.0.113.7"},
		{"CF-Connecting-IP", "header:CF-Connecting-IP", "10.0.0.2:80", map[string]string{"Cf-Connecting-Ip": "2001:db8:1:2::9", "X-Forwarded-For": "6.6.6.6"}, "2001:db8:1:2::/64"},
		{"IPv6 grouped by /64", "", "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::/64"},
		{"IPv4-mapped IPv6", "", "[::ffff:203.0.113.9]:443", nil, "203.0.113.9"},
		{"trusted IPv6 proxy", "", "[2001:db8:ffff::1]:443", map[string]string{"X-Forwarded-For": "2001:db8:aaaa:bbbb::1"}, "2001:db8:aaaa:bbbb::/64"},
		{"unparsable RemoteAddr", "", "pipe", nil, "unknown"},
	} {
		cfg, err := ParseConfig("t", []byte("client_ip: {source: \""+c.source+"\", trusted_proxies: [10.0.0.0/8, \"2001:db8:ffff::/48\"]}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		ci := mustClientIP(t, cfg)
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		if got := ci.Group(ci.clientAddr(r)); got != c.want {
			t.Errorf("%s: got %s, want %s", c.name, got, c.want)
		}
	}
}

// mustClientIP is cfg's client_ip section as the doors use it.
func mustClientIP(t testing.TB, cfg *Config) *clientIP {
	b, err := config.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ci := clientIPOf(b)
	return &ci
}
