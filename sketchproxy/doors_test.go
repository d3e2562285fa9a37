package sketchproxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// Every spelling of a Host names one host: rules judge it, and the
// upstream is sent the same canonical spelling.
func TestCanonicalHost(t *testing.T) {
	for _, c := range []struct{ in, canon, name string }{
		{"", "", ""},
		{"api.example.com", "api.example.com", "api.example.com"},
		{"API.Example.COM", "api.example.com", "api.example.com"},
		{"api.example.com.", "api.example.com", "api.example.com"},
		{"api.example.com:8080", "api.example.com:8080", "api.example.com"},
		{"api.example.com.:80", "api.example.com:80", "api.example.com"},
		{"api.example.com:", "api.example.com", "api.example.com"},
		{"B.Example.:0080", "b.example:80", "b.example"},
		{"b.example:00000", "b.example:0", "b.example"},
		{"127.0.0.1:9090", "127.0.0.1:9090", "127.0.0.1"},
		{"[::1]:80", "[::1]:80", "[::1]"},
		{"[2001:DB8:0:0::1]", "[2001:db8::1]", "[2001:db8::1]"},
		{"my_host", "my_host", "my_host"},
	} {
		canon, name, ok := httpnorm.CanonicalHost(c.in)
		if !ok || canon != c.canon || name != c.name {
			t.Errorf("httpnorm.CanonicalHost(%q) = %q, %q, %v; want %q, %q", c.in, canon, name, ok, c.canon, c.name)
		}
	}
	for _, bad := range []string{
		"api.example.com:80:80", "api.example.com:x", "api.example.com:65536", "api.example.com:123456",
		"api..example.com", ".api.example.com", "api.example.com..", ".", ":80",
		"api example.com", "api.example.com/x", "api\\example.com", "user@api.example.com",
		"api.example.com%00", "api\x00.example.com", "[::1", "[::1]x", "[1.2.3.4]", "[fe80::1%25eth0]",
		"::1", "ex\u00e4mple.com", strings.Repeat("a", 64) + ".com",
	} {
		if canon, _, ok := httpnorm.CanonicalHost(bad); ok {
			t.Errorf("httpnorm.CanonicalHost(%q) = %q, accepted; want refused", bad, canon)
		}
	}
}

// FuzzHost: whatever a client sends as Host, the canonical spelling is
// itself canonical (one way to write each host), names no port twice, and
// matches the rule host it claims case-insensitively.
func FuzzHost(f *testing.F) {
	for _, s := range []string{"api.example.com", "API.example.com.:80", "[::1]:80", "a:80:80", "a..b", "x_y:0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		canon, name, ok := httpnorm.CanonicalHost(h)
		if !ok {
			return
		}
		again, name2, ok2 := httpnorm.CanonicalHost(canon)
		if !ok2 || again != canon || name2 != name {
			t.Fatalf("%q -> %q (%q) -> %q (%q, %v): not one spelling", h, canon, name, again, name2, ok2)
		}
		if name != strings.ToLower(name) || strings.HasSuffix(name, ".") {
			t.Fatalf("%q: name %q is not canonical", h, name)
		}
		if strings.Count(strings.TrimPrefix(canon, name), ":") > 1 {
			t.Fatalf("%q -> %q: two ports", h, canon)
		}
	})
}

// A host rule applies to every spelling of its host, an invalid Host is
// refused before any rule, and a request without Host (HTTP/1.0) is
// judged by every host rule, since the upstream may route it to any.
func TestHostRules(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: api\n    match: {host: API.Example.com.}\n    limits: [{requests: 2, per: 1m}]\n")
	get := func(host string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "http://x/", nil)
		r.Host = host
		return h.do(r)
	}
	var codes []int
	for _, host := range []string{"api.example.com", "API.EXAMPLE.COM.:8080", "api.example.com:80", ""} {
		codes = append(codes, get(host).Code)
	}
	if fmt.Sprint(codes) != "[200 200 429 429]" {
		t.Errorf("four spellings of one host at 2 a minute: %v, want [200 200 429 429]", codes)
	}
	if w := get("other.example.com"); w.Code != 200 {
		t.Errorf("another host: %d", w.Code)
	}
	up := h.upstream.Load()
	for _, bad := range []string{"api.example.com:80:80", "api..example.com", "api.example.com:99999"} {
		if w := get(bad); w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "Host") {
			t.Errorf("Host %q: %d %s, want 400 naming the Host", bad, w.Code, w.Body)
		}
	}
	if h.upstream.Load() != up {
		t.Errorf("an invalid Host reached the upstream")
	}
	if _, err := ParseConfig("t.yaml", []byte("rules:\n  - match: {host: \"a b\"}\n    limits: [{requests: 1, per: 1s}]\n")); err == nil || !strings.Contains(err.Error(), "match.host") {
		t.Errorf("an invalid rule host: %v", err)
	}
}

// The upstream is sent the Host the rules judged.
func TestHostSentCanonical(t *testing.T) {
	h := newHarness(t, "rules:\n  - limits: [{requests: 10, per: 1m}]\n")
	var got string
	h.mw.next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Host })
	r := httptest.NewRequest("GET", "http://x/", nil)
	r.Host = "API.Example.COM.:8443"
	h.do(r)
	if got != "api.example.com:8443" {
		t.Errorf("upstream got Host %q, want api.example.com:8443", got)
	}
}

// CONNECT and TRACE are refused, whatever the rules, and so is a method in
// lower case (some upstreams serve "get" as GET); HEAD is judged as GET;
// OPTIONS * by rules for "/" (when a server passes it on at all: Go's
// answers it itself).
func TestMethods(t *testing.T) {
	h := newHarness(t, `rules:
  - name: root
    match: {path_prefix: /}
    limits: [{requests: 1, per: 1m}]
  - name: gets
    match: {methods: [GET]}
    key: ["header:X-K"]
    limits: [{requests: 1, per: 1m}]
`)
	r := httptest.NewRequest("CONNECT", "http://x/", nil)
	r.URL.Path, r.RequestURI, r.Host = "", "internal.example:22", "internal.example:22"
	if w := h.do(r); w.Code != http.StatusMethodNotAllowed || h.upstream.Load() != 0 {
		t.Errorf("CONNECT: %d, upstream reached %d times; want 405 and never", w.Code, h.upstream.Load())
	}
	for _, c := range []struct {
		method string
		code   int
	}{{"TRACE", 405}, {"get", 400}, {"head", 400}, {"Get", 400}} {
		r := httptest.NewRequest(c.method, "http://x/a", nil)
		if w := h.do(r); w.Code != c.code || h.upstream.Load() != 0 {
			t.Errorf("%s: %d, upstream reached %d times; want %d and never", c.method, w.Code, h.upstream.Load(), c.code)
		}
	}
	head := func(k string) int {
		r := httptest.NewRequest("HEAD", "http://x/a", nil)
		r.RemoteAddr = "203.0.113." + k + ":1"
		r.Header.Set("X-K", "k")
		return h.do(r).Code
	}
	if a, b := head("1"), head("2"); a != 200 || b != 429 {
		t.Errorf("two HEADs of one key under a GET rule of 1 a minute: %d %d, want 200 429", a, b)
	}
	opt := func() int {
		r := httptest.NewRequest("OPTIONS", "http://x/", nil)
		r.URL.Path, r.RequestURI = "*", "*"
		r.RemoteAddr = "203.0.113.9:1"
		return h.do(r).Code
	}
	if a, b := opt(), opt(); a != 200 || b != 429 {
		t.Errorf("OPTIONS * twice under a / rule of 1 a minute: %d %d, want 200 429", a, b)
	}
}

// Spellings that some upstreams fold onto /api/x count against /api/ rules;
// they are forwarded as sent.
func TestPathSpellingsFolded(t *testing.T) {
	for _, p := range []string{"/api;/x", "/api;jsessionid=1/x", "/api./x", "/api%20/x", "/API/x", "/api.%20/x", "//api/./x", "/api::$DATA/x", "/api:/x", "/api::$INDEX_ALLOCATION/x"} {
		t.Run(p, func(t *testing.T) {
			h := newHarness(t, "rules:\n  - match: {path_prefix: /api/}\n    limits: [{requests: 1, per: 1m}]\n")
			if a, b := h.reqPath(p).Code, h.reqPath(p).Code; a != 200 || b != 429 {
				t.Errorf("%s twice under /api/ at 1 a minute: %d %d, want 200 429", p, a, b)
			}
		})
	}
	for _, c := range []struct{ in, want string }{
		{"/api/x", "/api/x"},
		{"/api;a=1/x;b", "/api/x"},
		{"/static/app.js", "/static/app.js"},
		{"/a./b../c", "/a/b/c"},
		{"/.../x", "/.../x"},
		{"/a/.. /b", "/b"},
		{"/;x/api", "/api"},
		{"/v1/things:batchGet", "/v1/things"},
		{"/api/", "/api/"},
	} {
		if got := httpnorm.LoosePath(c.in); got != c.want {
			t.Errorf("httpnorm.LoosePath(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// The check's path, in any spelling and with any query, is answered by the
// check on the main listener and never proxied: a client gets 403, a
// gateway the verdict on the original request.
func TestCheckPathNeverProxied(t *testing.T) {
	h := newHarness(t, `client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {gateway: caddy}
rules:
  - name: api
    match: {path_prefix: /api/}
    limits: [{requests: 2, per: 1m}]
`)
	for _, p := range []string{"/check", "/check?x", "/check?q=hello", "//check", "/./check", "/CHECK", "/check/", "/%63heck", "/check;x", "/x/../check"} {
		r := httptest.NewRequest("GET", "http://api.test"+p, nil)
		r.RemoteAddr = "198.51.100.7:1234"
		if w := h.do(r); w.Code != http.StatusForbidden {
			t.Errorf("a client asking %s: %d, want 403 from the check", p, w.Code)
		}
	}
	if n := h.upstream.Load(); n != 0 {
		t.Errorf("the check's path was proxied %d times", n)
	}
	ask := func(query string) int {
		r := httptest.NewRequest("GET", "http://app.test/check"+query, nil)
		r.RemoteAddr = "127.0.0.1:5555"
		r.Header.Set("X-Forwarded-For", "203.0.113.5")
		r.Header.Set("X-Forwarded-Method", "GET")
		r.Header.Set("X-Forwarded-Uri", "/api/items"+query)
		return h.do(r).Code
	}
	if got := fmt.Sprint(ask("?x"), ask("?q=hello"), ask("?x")); got != "200 200 429" {
		t.Errorf("Caddy's checks of /api/items with a query: %s, want 200 200 429", got)
	}
	if n := h.upstream.Load(); n != 0 {
		t.Errorf("a check was proxied %d times", n)
	}
}

// Each named gateway's check reads only the headers that gateway sets: a
// client's own copies of the others, passed through, choose nothing.
func TestForwardAuthGatewayHeaders(t *testing.T) {
	const rules = `rules:
  - name: api
    match: {host: api.example.com}
    limits: [{requests: 2, per: 1m}]
`
	type hdrs map[string]string
	cases := []struct {
		gateway string
		host    string // the check request's Host
		set     hdrs   // the gateway's headers
		spoof   hdrs   // the client's, passed through
	}{
		{"caddy", "api.example.com", hdrs{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/x"},
			hdrs{"X-Forwarded-Host": "other.example.com", "X-Original-Host": "other.example.com", "X-Original-Uri": "/y", "X-Original-Method": "POST"}},
		{"nginx", "sketchproxy", hdrs{"X-Original-Method": "GET", "X-Original-Uri": "/x", "X-Original-Host": "api.example.com"},
			hdrs{"X-Forwarded-Host": "other.example.com", "X-Forwarded-Uri": "/y", "X-Forwarded-Method": "POST"}},
		{"traefik", "127.0.0.1:9090", hdrs{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/x", "X-Forwarded-Host": "api.example.com"},
			hdrs{"X-Original-Host": "other.example.com", "X-Original-Uri": "/y", "X-Original-Method": "POST"}},
		// Unnamed: a host rule applies if any of the hosts names it.
		{"", "api.example.com", hdrs{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/x"},
			hdrs{"X-Forwarded-Host": "other.example.com"}},
		{"", "127.0.0.1:9090", hdrs{"X-Forwarded-Method": "GET", "X-Forwarded-Uri": "/x", "X-Forwarded-Host": "api.example.com"},
			hdrs{"X-Original-Host": "other.example.com"}},
	}
	for _, c := range cases {
		t.Run(c.gateway+"/"+c.host, func(t *testing.T) {
			h := newHarness(t, fmt.Sprintf("client_ip: {trusted_proxies: [127.0.0.1/32]}\nforward_auth: {gateway: %q, refusal_status: 403}\n%s", c.gateway, rules))
			var got []string
			for range 3 {
				r := httptest.NewRequest("GET", "http://x/check", nil)
				r.Host = c.host
				r.RemoteAddr = "127.0.0.1:5555"
				r.Header.Set("X-Forwarded-For", "203.0.113.5")
				for k, v := range c.set {
					r.Header.Set(k, v)
				}
				for k, v := range c.spoof {
					r.Header.Set(k, v)
				}
				w := h.do(r)
				got = append(got, fmt.Sprintf("%d/%s", w.Code, w.Header().Get("SketchProxy-Status")))
			}
			if fmt.Sprint(got) != "[200/ 200/ 403/]" {
				t.Errorf("three checks at 2 a minute with a client's spoofed headers: %v, want [200/ 200/ 403/]", got)
			}
		})
	}
}

// With nginx's refusal status, a check that is not a refusal (a bad path,
// a missing header) is sent as 403 too, with its own status in
// SketchProxy-Status: auth_request turns any other status into 500.
func TestForwardAuthPassableStatus(t *testing.T) {
	h := newHarness(t, "client_ip: {trusted_proxies: [127.0.0.1/32]}\nforward_auth: {gateway: nginx, refusal_status: 403}\nrules:\n  - limits: [{requests: 5, per: 1m}]\n")
	for _, c := range []struct {
		name string
		hdr  map[string]string
		want string
	}{
		{"encoded slash", map[string]string{"X-Original-Method": "GET", "X-Original-Uri": "/a%2Fb", "X-Original-Host": "h"}, "403 400"},
		{"control byte", map[string]string{"X-Original-Method": "GET", "X-Original-Uri": "/a%01", "X-Original-Host": "h"}, "403 400"},
		{"lower-case method", map[string]string{"X-Original-Method": "get", "X-Original-Uri": "/a", "X-Original-Host": "h"}, "403 400"},
		{"no host (HTTP/1.0): judged by every host rule", map[string]string{"X-Original-Method": "GET", "X-Original-Uri": "/a"}, "200 "},
		{"connect", map[string]string{"X-Original-Method": "CONNECT", "X-Original-Uri": "/a", "X-Original-Host": "h"}, "403 405"},
		{"fine", map[string]string{"X-Original-Method": "GET", "X-Original-Uri": "/a", "X-Original-Host": "h"}, "200 "},
	} {
		r := httptest.NewRequest("GET", "http://x/check", nil)
		r.RemoteAddr = "127.0.0.1:5555"
		r.Header.Set("X-Forwarded-For", "203.0.113.5")
		for k, v := range c.hdr {
			r.Header.Set(k, v)
		}
		w := h.do(r)
		if got := fmt.Sprint(w.Code, " ", w.Header().Get("SketchProxy-Status")); got != c.want {
			t.Errorf("%s: %q, want %q (%s)", c.name, got, c.want, w.Body)
		}
	}
}

// A file's explicit 0 is honoured; a field left out takes its default; a
// negative value set in code asks for 0 too.
func TestExplicitZeros(t *testing.T) {
	k := newJWTKeys(t)
	const zeros = `server: {upstream_timeout: 0s}
tarpit: {max_delay: 0s, max_held: 0, max_held_per_key: 0}
new_keys: {warmup: 0s}
jwt: {public_key_file: %q, leeway: 0s}
rules:
  - budget: {units: 10, per: 1m, reconcile_wait: 0s}
`
	const unset = `jwt: {public_key_file: %q}
rules:
  - budget: {units: 10, per: 1m}
`
	got := func(c *Config) string {
		return fmt.Sprint(c.Server.UpstreamTimeout, c.Tarpit.MaxDelay, c.Tarpit.MaxHeld, c.Tarpit.MaxHeldPerKey,
			c.NewKeys.Warmup, c.JWT.Leeway, c.Rules[0].Budget.ReconcileWait)
	}
	c, err := ParseConfig("zeros.yaml", []byte(fmt.Sprintf(zeros, k.pubFile)))
	if err != nil {
		t.Fatal(err)
	}
	if g := got(c); g != "0 0 0 0 0 0 0" {
		t.Errorf("explicit zeros: %s", g)
	}
	c, err = ParseConfig("unset.yaml", []byte(fmt.Sprintf(unset, k.pubFile)))
	if err != nil {
		t.Fatal(err)
	}
	def := fmt.Sprint(Duration(time.Minute), Duration(5*time.Second), 256, 2, Duration(time.Minute), Duration(30*time.Second), Duration(time.Minute))
	if g := got(c); g != def {
		t.Errorf("defaults: %s, want %s", g, def)
	}
	code := &Config{
		Server:  ServerConfig{UpstreamTimeout: -1},
		Tarpit:  TarpitConfig{MaxDelay: -1, MaxHeld: -1, MaxHeldPerKey: -1},
		NewKeys: NewKeysConfig{Warmup: -1},
		Rules:   []Rule{{Budget: &Budget{Units: 10, Per: Duration(time.Minute), ReconcileWait: -1}}},
	}
	b, err := config.Build(code)
	if err != nil {
		t.Fatal(err)
	}
	p := b.Config()
	if g := fmt.Sprint(p.Server.UpstreamTimeout, p.Tarpit.MaxDelay, p.Tarpit.MaxHeld, p.Tarpit.MaxHeldPerKey, p.NewKeys.Warmup, p.Rules[0].Budget.ReconcileWait); g != "0 0 0 0 0 0" {
		t.Errorf("negative values in code: %s", g)
	}

	// max_delay: 0s holds nothing: a request over the limit is refused at
	// once, never delayed.
	h := newHarness(t, "tarpit: {max_delay: 0s}\nrules:\n  - tarpit: true\n    limits: [{requests: 1, per: 1m}]\n")
	for range 4 {
		h.req("203.0.113.1")
	}
	if len(h.slept) != 0 {
		t.Errorf("max_delay 0s: requests slept %v", h.slept)
	}
}

// Limits without a name are named by their period, readably and uniquely.
func TestDefaultLimitNames(t *testing.T) {
	c, err := ParseConfig("t.yaml", []byte(`rules:
  - limits:
      - {requests: 5, per: 10s}
      - {requests: 50, per: 10m}
      - {requests: 60, per: 10s}
      - {requests: 100, per: 1h}
      - {requests: 1000, per: 1d}
      - {requests: 3, per: 1500ms}
      - {requests: 200, per: 90m}
`))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range c.Rules[0].Limits {
		names = append(names, l.Name)
	}
	if got := strings.Join(names, " "); got != "per-10s per-10m per-10s-2 per-1h per-1d per-1_5s per-1h30m" {
		t.Errorf("names: %s", got)
	}
}

// A reload whose jwt section is unchanged keeps the fetched keys even when
// the JWKS endpoint now fails; a fetch that brings no keys never replaces
// good ones; a hanging endpoint delays neither the start nor a request.
func TestJWKSKeptAcrossReloads(t *testing.T) {
	k := newJWTKeys(t)
	mode := make(chan string, 1)
	mode <- "good"
	hits := make(chan string, 100)
	release := make(chan struct{})
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := <-mode
		mode <- m
		hits <- m
		switch m {
		case "good":
			w.Write(k.jwks)
		case "empty":
			w.Write([]byte(`{"keys":[]}`))
		case "broken": // parses, but its one key cannot verify anything
			w.Write([]byte(`{"keys":[{"kty":"RSA","kid":"k1","n":"zz","e":"AQAB"}]}`))
		case "fail":
			http.Error(w, "down", http.StatusInternalServerError)
		case "hang":
			<-release
		}
	}))
	defer jwks.Close()
	defer close(release)
	setMode := func(m string) { <-mode; mode <- m }
	yaml := func(more string) string {
		return fmt.Sprintf("jwt: {jwks_url: %q%s}\nrules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 100, per: 1m}]\n", jwks.URL, more)
	}
	h := newHarness(t, yaml(""))
	jwksOf(t, h.mw).Unspaced() // fetches as fast as the test kicks them
	<-hits
	tok := k.sign(t, jwt.SigningMethodRS256, k.rsa, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	ok := func(when string) {
		t.Helper()
		if w := h.req("198.51.100.1", "Authorization", "Bearer "+tok); w.Code != 200 {
			t.Fatalf("%s: a valid token got %d %s", when, w.Code, w.Body)
		}
	}
	ok("at the start")
	setMode("fail")
	var cfg *Config
	var err error
	// Unchanged, another leeway, another refresh interval (the same URL),
	// then another URL that fails: the keys stay until it answers.
	for _, more := range []string{"", ", leeway: 10s", ", jwks_refresh: 2m", ", jwks_refresh: 2m, leeway: 0s"} {
		cfg, err = ParseConfig("t.yaml", []byte(yaml(more)))
		if err != nil {
			t.Fatal(err)
		}
		if err := h.mw.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		ok("after a reload with the JWKS down, and " + more)
	}
	cfg, err = ParseConfig("t.yaml", []byte(strings.Replace(yaml(""), jwks.URL, jwks.URL+"/moved", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.mw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	jwksOf(t, h.mw).Unspaced()
	ok("after a reload to another JWKS URL that fails")
	// A token naming a key the set lacks asks for a fetch; an empty set
	// fetched then replaces nothing.
	setMode("empty")
	ut := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"sub": "bob", "exp": time.Now().Add(time.Hour).Unix()})
	ut.Header["kid"] = "kid-unknown"
	unknown, err := ut.SignedString(k.rsa)
	if err != nil {
		t.Fatal(err)
	}
	if w := h.req("198.51.100.1", "Authorization", "Bearer "+unknown); w.Code != 401 {
		t.Errorf("a token of an unknown key: %d", w.Code)
	}
	for m := ""; m != "empty"; {
		select {
		case m = <-hits:
		case <-time.After(30 * time.Second):
			t.Fatal("an unknown key asked for no fetch")
		}
	}
	jwksOf(t, h.mw).Kick() // queued behind the fetch: once taken, the empty set was judged
	for deadline := time.Now().Add(30 * time.Second); jwksOf(t, h.mw).Pending() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the fetch loop did not go on")
		}
		time.Sleep(time.Millisecond)
	}
	ok("after an empty key set was fetched")
	// A set that parses but holds no usable key replaces nothing either.
	setMode("broken")
	moved := jwksOf(t, h.mw)
	moved.Kick()
	for m := ""; m != "broken"; {
		select {
		case m = <-hits:
		case <-time.After(60 * time.Second):
			t.Fatal("no fetch of the broken set")
		}
	}
	moved.Kick() // taken once the broken set was judged
	for deadline := time.Now().Add(60 * time.Second); moved.Pending() != 0; {
		if time.Now().After(deadline) {
			t.Fatal("the fetch loop did not go on")
		}
		time.Sleep(time.Millisecond)
	}
	ok("after a broken key set was fetched")

	// A hanging JWKS at the start: New returns at once, and a request is
	// refused at once rather than held.
	setMode("hang")
	cfg, err = ParseConfig("t.yaml", []byte(fmt.Sprintf("jwt: {jwks_url: %q}\nrules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 100, per: 1m}]\n", jwks.URL+"/other")))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	r := httptest.NewRequest("GET", "http://x/", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r) // the endpoint hangs until the test ends: returning at all is the check
	if w.Code != 401 || !strings.Contains(w.Body.String(), "not been fetched") {
		t.Errorf("before the first fetch: %d %s", w.Code, w.Body)
	}
}

// A reload that moves the check off the proxy's listener, or removes it,
// leaves its path answered by the check there until a restart: never
// handed to the app.
func TestCheckPathSurvivesReload(t *testing.T) {
	h := newHarness(t, "client_ip: {trusted_proxies: [127.0.0.1/32]}\nforward_auth: {gateway: caddy}\nrules:\n  - limits: [{requests: 100, per: 1m}]\n")
	for _, next := range []string{
		"forward_auth: {gateway: caddy, listen: \"127.0.0.1:0\"}\n",
		"forward_auth: {gateway: caddy, path: /auth}\n",
		"",
	} {
		cfg, err := ParseConfig("t.yaml", []byte("client_ip: {trusted_proxies: [127.0.0.1/32]}\n"+next+"rules:\n  - limits: [{requests: 100, per: 1m}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		if err := h.mw.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"/check?x", "//check"} {
			r := httptest.NewRequest("GET", "http://x"+p, nil)
			r.RemoteAddr = "127.0.0.1:5555"
			r.Header.Set("X-Forwarded-Method", "GET")
			r.Header.Set("X-Forwarded-Uri", "/api/x")
			h.do(r)
		}
		if n := h.upstream.Load(); n != 0 {
			t.Fatalf("after a reload to %q, the old check path reached the app %d times", next, n)
		}
	}
}

// A file's negative value for a field whose 0 means none is an error; an
// empty one is a field left out.
func TestZerosInFiles(t *testing.T) {
	for _, bad := range []string{"server: {upstream_timeout: -5s}", "new_keys: {warmup: -1m}", "tarpit: {max_delay: -2s}", "tarpit: {max_held: -7}"} {
		_, err := ParseConfig("t.yaml", []byte(bad+"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err == nil || !strings.Contains(err.Error(), "want 0 (none) or more") {
			t.Errorf("%s: %v, want an error", bad, err)
		}
	}
	c, err := ParseConfig("t.yaml", []byte("server: {upstream_timeout: }\ntarpit:\n  max_held:\nrules:\n  - limits: [{requests: 1, per: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Server.UpstreamTimeout != Duration(time.Minute) || c.Tarpit.MaxHeld != 256 {
		t.Errorf("empty fields: upstream_timeout %v, max_held %d; want the defaults", c.Server.UpstreamTimeout, c.Tarpit.MaxHeld)
	}
}
