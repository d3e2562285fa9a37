package sketchproxy

import (
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

const forwardAuthYAML = `
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {refusal_status: %d}
rules:
  - name: api
    match: {path_prefix: /api/, methods: [GET]}
    limits: [{requests: 3, per: 10s}]
  - name: login
    match: {host: auth.test, path_prefix: /login}
    key: [ip, "header:X-User"]
    limits: [{requests: 1, per: 10s}]
`

// check asks the harness's forward-auth endpoint from peer with the
// gateway's headers hdr (name, value pairs).
func (h *harness) check(peer string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "http://sketchproxy.test/check", nil)
	r.RemoteAddr = peer + ":5555"
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.mw.ForwardAuth().ServeHTTP(w, r)
	return w
}

func TestForwardAuthDecides(t *testing.T) {
	for _, status := range []int{429, 403} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			h := newHarness(t, strings.Replace(forwardAuthYAML, "%d", strconv.Itoa(status), 1))
			// Caddy and Traefik's headers.
			caddy := func(client, uri string) []string {
				return []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", uri, "X-Forwarded-Host", "api.test", "X-Forwarded-For", client}
			}
			for i := range 3 {
				w := h.check("127.0.0.1", caddy("203.0.113.7", "/api/items?page="+strconv.Itoa(i))...)
				if w.Code != 200 || !strings.Contains(w.Header().Get("RateLimit"), `;r=`+strconv.Itoa(2-i)+`;`) {
					t.Fatalf("check %d: %d RateLimit %q", i+1, w.Code, w.Header().Get("RateLimit"))
				}
			}
			w := h.check("127.0.0.1", caddy("203.0.113.7", "/api/items")...)
			if w.Code != status || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Header().Get("RateLimit"), "r=0") {
				t.Fatalf("4th check: %d, headers %v", w.Code, w.Header())
			}
			// Another client, and the same client on a path no rule matches.
			if w := h.check("127.0.0.1", caddy("203.0.113.8", "/api/items")...); w.Code != 200 {
				t.Errorf("other client: %d", w.Code)
			}
			if w := h.check("127.0.0.1", caddy("203.0.113.7", "/static/x")...); w.Code != 200 || w.Header().Get("RateLimit") != "" {
				t.Errorf("unmatched path: %d %v", w.Code, w.Header())
			}
			// The client's odd spelling of the path is the same path.
			if w := h.check("127.0.0.1", caddy("203.0.113.7", "/API/./items/../items")...); w.Code != status {
				t.Errorf("respelled path: %d, want %d", w.Code, status)
			}
			// nginx's conventional headers; the method matters.
			nginx := []string{"X-Original-Method", "POST", "X-Original-URI", "/api/items", "X-Forwarded-For", "203.0.113.7"}
			if w := h.check("127.0.0.1", nginx...); w.Code != 200 {
				t.Errorf("POST, which the rule does not match: %d", w.Code)
			}
			// Host and a header key part come from the original request.
			login := []string{"X-Original-Method", "POST", "X-Original-URI", "/login", "X-Original-Host", "auth.test", "X-Forwarded-For", "198.51.100.1", "X-User", "ann"}
			if w := h.check("127.0.0.1", login...); w.Code != 200 {
				t.Fatalf("first login: %d", w.Code)
			}
			if w := h.check("127.0.0.1", login...); w.Code != status {
				t.Errorf("second login: %d, want %d", w.Code, status)
			}
			login[len(login)-1] = "bob"
			if w := h.check("127.0.0.1", login...); w.Code != 200 {
				t.Errorf("another user's login: %d", w.Code)
			}
		})
	}
}

func TestForwardAuthRefusesWhatItCannotTrust(t *testing.T) {
	h := newHarness(t, strings.Replace(forwardAuthYAML, "%d", "429", 1))
	good := []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/api/x", "X-Forwarded-For", "203.0.113.9"}
	// A caller that is not the gateway is not answered, however it spells
	// its headers: it could name any client.
	if w := h.check("198.51.100.50", good...); w.Code != 403 || !strings.Contains(w.Body.String(), "trusted_proxies") {
		t.Errorf("untrusted caller: %d %s", w.Code, w.Body)
	}
	for _, c := range []struct {
		name string
		hdr  []string
		want string
	}{
		{"no method", []string{"X-Forwarded-Uri", "/api/x"}, "original method"},
		{"no URI", []string{"X-Forwarded-Method", "GET"}, "original request URI"},
		{"bad method", []string{"X-Forwarded-Method", "GE T", "X-Forwarded-Uri", "/api/x"}, "not a method"},
		{"absolute URI", []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "http://evil/api/x"}, "must start with /"},
		{"two URIs", []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/api/x", "X-Forwarded-Uri", "/other"}, "more than once"},
		{"disagreeing families", []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/api/x", "X-Original-URI", "/free"}, "disagree"},
		{"encoded slash", []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/api%2Fx"}, ""},
		{"control byte", []string{"X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/api/\x01"}, ""},
	} {
		w := h.check("127.0.0.1", c.hdr...)
		if w.Code != 400 || !strings.Contains(w.Body.String(), c.want) {
			t.Errorf("%s: %d %s", c.name, w.Code, w.Body)
		}
	}
	if got := h.upstream.Load(); got != 0 {
		t.Errorf("the upstream saw %d requests: a check proxies nothing", got)
	}
}

func TestForwardAuthConfig(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"forward_auth: {}\nrules: [{name: a, limits: [{requests: 1, per: 1s}]}]\n", "trusted_proxies"},
		{"client_ip: {trusted_proxies: [10.0.0.1]}\nforward_auth: {path: check}\nrules: [{name: a, limits: [{requests: 1, per: 1s}]}]\n", "clean absolute path"},
		{"client_ip: {trusted_proxies: [10.0.0.1]}\nforward_auth: {refusal_status: 500}\nrules: [{name: a, limits: [{requests: 1, per: 1s}]}]\n", "want 429"},
		{"client_ip: {trusted_proxies: [10.0.0.1]}\nforward_auth: {pth: /x}\nrules: [{name: a, limits: [{requests: 1, per: 1s}]}]\n", "pth"},
	} {
		_, err := ParseConfig("fa.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "fa.yaml:") {
			t.Errorf("%q: %v, want an error naming the file and %q", c.yaml, err, c.want)
		}
	}
	cfg, err := ParseConfig("fa.yaml", []byte("client_ip: {trusted_proxies: [10.0.0.1]}\nforward_auth: {}\nrules: [{name: a, limits: [{requests: 1, per: 1s}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if fa := cfg.ForwardAuth; fa.Path != "/check" || fa.RefusalStatus != 429 {
		t.Errorf("defaults: %+v", fa)
	}
}
