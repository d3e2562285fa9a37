package sketchproxy

import (
	"bufio"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// FuzzClientAddr: whatever the headers, the client is the peer unless the
// peer is trusted, and then an address the source header names with only
// trusted proxies to its right.
func FuzzClientAddr(f *testing.F) {
	for _, s := range []struct{ remote, v1, v2 string }{
		{"10.0.0.1:80", "198.51.100.9, 10.1.1.1", ""},
		{"10.0.0.1:80", "6.6.6.6, 198.51.100.9", "10.2.2.2"},
		{"203.0.113.9:1", "1.1.1.1", ""},
		{"[2001:db8:ffff::1]:443", `for="[2001:db8::1]:4711";proto=https, for=10.0.0.3`, ""},
		{"10.0.0.1:80", ",,, ,zz", "unknown"},
		{"10.0.0.1:80", strings.Repeat("10.0.0.9,", 100), ""},
	} {
		for src := range 4 {
			f.Add(s.remote, s.v1, s.v2, uint8(src))
		}
	}
	sources := []string{sourceXFF, sourceForwarded, sourceRealIP, "header:cf-connecting-ip"}
	f.Fuzz(func(t *testing.T, remote, v1, v2 string, src uint8) {
		cfg, err := ParseConfig("f", []byte("client_ip: {source: "+sources[int(src)%len(sources)]+", trusted_proxies: [10.0.0.0/8, \"2001:db8:ffff::/48\"]}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		ci := mustClientIP(t, cfg)
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		for _, v := range []string{v1, v2} {
			if v != "" {
				r.Header.Add(ci.sourceHeader(), v)
			}
		}
		// Decoys, never read unless they are the source.
		for h, v := range map[string]string{"X-Forwarded-For": "6.6.6.6", "Forwarded": "for=7.7.7.7", "X-Real-Ip": "8.8.8.8"} {
			if h != ci.sourceHeader() {
				r.Header.Add(h, v)
			}
		}
		got := ci.clientAddr(r)
		peer := parseHost(remote)
		if !peer.IsValid() || !ci.isTrusted(peer) {
			if got != peer {
				t.Fatalf("untrusted peer %q: client %v", remote, got)
			}
			return
		}
		if got == peer {
			return
		}
		// got is named in the source, and every hop right of it is trusted.
		var hops []netip.Addr
		for _, v := range r.Header.Values(ci.sourceHeader()) {
			for _, e := range strings.Split(v, ",") {
				if ci.Source == sourceForwarded {
					e = forwardedFor(e)
				}
				hops = append(hops, parseHost(e))
			}
		}
		found := false
		for i := len(hops) - 1; i >= 0; i-- {
			if hops[i] == got {
				found = true
				break
			}
			if !hops[i].IsValid() || !ci.isTrusted(hops[i]) {
				t.Fatalf("client %v, but hop %v right of it is not a trusted proxy (%q, %q)", got, hops[i], v1, v2)
			}
		}
		if !found {
			t.Fatalf("client %v is not in the source header (%q, %q)", got, v1, v2)
		}
	})
}

// FuzzPath: a path the proxy accepts is rewritten to a clean path that
// the upstream reads back as the same path, and rules see exactly it.
func FuzzPath(f *testing.F) {
	for _, s := range []string{
		"/api/x", "//api/x", "/./api/x", "/x/../api/x", "/%2Fapi/x", "/%2e%2e/api", "/api/", "/a/b/..",
		"/%61pi/x", "/a%20b/./c", "/..;/x", "/a\\b", "/a%00", "/%zz", "*", "/a/.", "/caf%C3%A9/", "/a;b=c/../d",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, target string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")))
		if err != nil {
			return // the server answers 400 before any handler
		}
		why := httpnorm.PathProblem(r)
		raw := r.URL.EscapedPath()
		if strings.Contains(strings.ToLower(raw), "%2f") && why == "" {
			t.Fatalf("%q: an encoded slash accepted", target)
		}
		if why != "" || r.URL.Path == "" || r.URL.Path[0] != '/' {
			return
		}
		httpnorm.NormalizePath(r)
		p := r.URL.Path
		if strings.Contains(p, "//") || strings.Contains(p+"/", "/./") || strings.Contains(p+"/", "/../") {
			t.Fatalf("%q: not clean: %q", target, p)
		}
		if httpnorm.CleanPath(p) != p {
			t.Fatalf("%q: cleaning is not idempotent: %q then %q", target, p, httpnorm.CleanPath(p))
		}
		// What the upstream receives decodes to the path the rules saw.
		sent := r.URL.EscapedPath()
		back, err := url.PathUnescape(sent)
		if err != nil || back != p {
			t.Fatalf("%q: forwarded as %q, which reads as %q (%v), not %q", target, sent, back, err, p)
		}
		// A server that cleans the path itself serves the same path.
		if c := path.Clean(back); c != strings.TrimSuffix(p, "/") && !(p == "/" && c == "/") {
			t.Fatalf("%q: the upstream would serve %q, the rules matched %q", target, c, p)
		}
		// The folded form (parameters, trailing dots and spaces) is clean,
		// folded already, and has no parameter left for Tomcat to cut.
		l := httpnorm.LoosePath(p)
		if httpnorm.CleanPath(l) != l || httpnorm.LoosePath(l) != l || strings.Contains(l, ";") {
			t.Fatalf("%q: folded to %q, which is not clean and folded (%q, %q)", target, l, httpnorm.CleanPath(l), httpnorm.LoosePath(l))
		}
	})
}
