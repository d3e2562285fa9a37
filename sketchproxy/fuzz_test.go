package sketchproxy

import (
	"bufio"
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

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
