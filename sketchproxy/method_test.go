package sketchproxy

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

const deleteRuleYAML = `client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {}
rules:
  - name: deletes
    match: {methods: [DELETE]}
    key: ["header:X-API-Key"]
    limits: [{requests: 1, per: 1m}]
  - name: gets
    match: {methods: [GET]}
    key: ["header:X-API-Key"]
    limits: [{requests: 1, per: 1m}]
`

// overrides are POSTs that frameworks (Rails, Laravel, Symfony, Express's
// method-override) route as another method, and the method: each is
// judged as that method too.
var overrides = []struct {
	name, query string
	hdr         []string
	as          string
}{
	{"X-HTTP-Method-Override", "", []string{"X-HTTP-Method-Override", "DELETE"}, "DELETE"},
	{"X-HTTP-Method", "", []string{"X-HTTP-Method", "DELETE"}, "DELETE"},
	{"X-Method-Override", "", []string{"X-Method-Override", "DELETE"}, "DELETE"},
	{"lower case", "", []string{"X-HTTP-Method-Override", "delete"}, "DELETE"},
	{"a list", "", []string{"X-HTTP-Method-Override", "delete, PUT"}, "DELETE"},
	{"behind another", "", []string{"X-HTTP-Method-Override", "PUT", "X-HTTP-Method-Override", "DELETE"}, "DELETE"},
	{"_method", "_method=DELETE", nil, "DELETE"},
	{"_method encoded", "%5Fmethod=delete", nil, "DELETE"},
	{"_method twice", "_method=PUT&_method=DELETE", nil, "DELETE"},
	{".method (PHP's _method)", ".method=DELETE", nil, "DELETE"},
	{"[method (PHP's _method)", "%5Bmethod=DELETE", nil, "DELETE"},
	{"a space before _method", "%20_method=DELETE", nil, "DELETE"},
	{"HEAD override", "", []string{"X-HTTP-Method-Override", "HEAD"}, "GET"},
}

// A POST overridden to DELETE counts under a DELETE limit (and a HEAD one
// under a GET limit), through the proxy and through the forward-auth
// check: the second such request of a key under a limit of 1 a minute is
// refused. The proxy judged only the POST, so every one passed.
func TestMethodOverridesMatch(t *testing.T) {
	for _, door := range []string{"proxy", "forward-auth"} {
		for i, c := range overrides {
			t.Run(door+"/"+c.name, func(t *testing.T) {
				h := newHarness(t, deleteRuleYAML)
				key := "k" + strconv.Itoa(i)
				send := func() int {
					uri := "/v1/items/7"
					if c.query != "" {
						uri += "?" + c.query
					}
					if door == "proxy" {
						r := httptest.NewRequest("POST", "http://api.test"+uri, nil)
						r.RemoteAddr = "198.51.100.1:1234"
						r.Header.Set("X-API-Key", key)
						for j := 0; j+1 < len(c.hdr); j += 2 {
							r.Header.Add(c.hdr[j], c.hdr[j+1])
						}
						return h.do(r).Code
					}
					// A gateway passes the client's headers on, and its
					// method and URI in its own.
					hdr := append([]string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", uri, "X-Forwarded-Host", "api.test",
						"X-Forwarded-For", "203.0.113.7", "X-API-Key", key}, c.hdr...)
					return h.check("127.0.0.1", hdr...).Code
				}
				if a, b := send(), send(); a != 200 || b != 429 {
					t.Errorf("two POSTs as %s of one key under a %s limit of 1 a minute: %d %d, want 200 429", c.as, c.as, a, b)
				}
			})
		}
	}
}

// A method reaching the forward-auth check in lower case is refused, as
// the proxy refuses it (400): a Caddy or Traefik in front passes "delete"
// on, which some upstreams serve as DELETE.
func TestForwardAuthLowerCaseMethod(t *testing.T) {
	h := newHarness(t, deleteRuleYAML)
	w := h.check("127.0.0.1", "X-Forwarded-Method", "delete", "X-Forwarded-Uri", "/v1/items/7", "X-Forwarded-Host", "api.test",
		"X-Forwarded-For", "203.0.113.7", "X-API-Key", "k")
	if w.Code != 400 && w.Header().Get("SketchProxy-Status") != "400" {
		t.Errorf("a check of %q: %d, SketchProxy-Status %q; want a refusal with 400", "delete", w.Code, w.Header().Get("SketchProxy-Status"))
	}
}

// A POST that names more methods than Methods lists matches every method,
// and a GET's override headers are not read (frameworks read them on a
// POST only).
func TestMethodsOf(t *testing.T) {
	r := httptest.NewRequest("POST", "http://x/?_method=A,B,C,D,E,F,G,H", nil)
	if ms := MethodsOf(r); !ms.All || !ms.In(map[string]bool{"DELETE": true}) {
		t.Errorf("a POST naming 9 methods: %v, want All", ms.List())
	}
	r = httptest.NewRequest("GET", "http://x/?_method=DELETE", nil)
	r.Header.Set("X-HTTP-Method-Override", "DELETE")
	if ms := MethodsOf(r); strings.Join(ms.List(), " ") != "GET" {
		t.Errorf("a GET with overrides: %v, want GET alone", ms.List())
	}
	r = httptest.NewRequest("POST", "http://x/", nil)
	r.Header.Set("X-HTTP-Method-Override", "GE T, \"x\"")
	if ms := MethodsOf(r); strings.Join(ms.List(), " ") != "POST" {
		t.Errorf("a POST with overrides that are not methods: %v, want POST alone", ms.List())
	}
}
