package sketchproxy

import (
	"net/http/httptest"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// TestClientAddr: client_ip's source picks the one header read, every
// other forwarding header ignored; trusted_proxies and the prefixes apply.
// How a header is walked is package clientip's (limit/clientip), tested
// there.
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
		// The issue this guards: a client that rotates a header the load
		// balancer does not touch must not pick its key.
		{"Forwarded ignored when the source is XFF", "", "10.0.0.2:80", map[string]string{"Forwarded": `for=6.6.6.6`, "X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		{"X-Real-IP ignored when the source is XFF", "", "10.0.0.2:80", map[string]string{"X-Real-Ip": `6.6.6.6`, "X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		{"Forwarded as the source", "forwarded", "10.0.0.2:80", map[string]string{"Forwarded": `for=192.0.2.60;proto=http;by=10.0.0.2`, "X-Forwarded-For": "6.6.6.6"}, "192.0.2.60"},
		{"XFF ignored when the source is Forwarded", "forwarded", "10.0.0.2:80", map[string]string{"X-Forwarded-For": "6.6.6.6"}, "10.0.0.2"},
		{"X-Real-IP as the source", "x-real-ip", "10.0.0.2:80", map[string]string{"X-Real-IP": "198.51.100.4", "X-Forwarded-For": "6.6.6.6"}, "198.51.100.4"},
		{"X-Real-IP from an untrusted peer", "x-real-ip", "203.0.113.7:80", map[string]string{"X-Real-IP": "198.51.100.4"}, "203.0.113.7"},
		{"CF-Connecting-IP", "header:CF-Connecting-IP", "10.0.0.2:80", map[string]string{"Cf-Connecting-Ip": "2001:db8:1:2::9", "X-Forwarded-For": "6.6.6.6"}, "2001:db8:1:2::/64"},
		{"IPv6 grouped by /64", "", "[2001:db8:1:2:3:4:5:6]:443", nil, "2001:db8:1:2::/64"},
		{"unparsable RemoteAddr", "", "pipe", nil, "unknown"},
		// A zone names the receiving interface: a link-local proxy is
		// trusted by its address (the zone made it untrusted).
		{"zoned trusted peer", "", "[fe80::1%eth0]:80", map[string]string{"X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
		// An IPv4-mapped prefix trusts the IPv4 addresses it maps (it
		// matched none).
		{"mapped trusted prefix", "", "172.16.0.1:80", map[string]string{"X-Forwarded-For": "198.51.100.9"}, "198.51.100.9"},
	} {
		cfg, err := ParseConfig("t", []byte("client_ip: {source: \""+c.source+"\", trusted_proxies: [10.0.0.0/8, \"2001:db8:ffff::/48\", \"fe80::1\", \"::ffff:172.16.0.0/108\"]}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		ci := mustClientIP(t, cfg)
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remote
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		if got := ci.group(ci.clientAddr(r)); got != c.want {
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
