package sketchproxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dunglas/httpsfv"

	"github.com/epochsketch/epochsketch"
)

// A client behind a trusted load balancer that appends to X-Forwarded-For
// only cannot pick a fresh key per request with a header the balancer does
// not touch.
func TestClientCannotPickItsKey(t *testing.T) {
	h := newHarness(t, "client_ip: {trusted_proxies: [10.0.0.0/8]}\nrules:\n  - name: ip\n    limits: [{requests: 1, per: 1m}]\n")
	allowed := 0
	for i := range 20 {
		w := h.req("10.0.0.1", "X-Forwarded-For", "198.51.100.7",
			"Forwarded", fmt.Sprintf("for=192.0.2.%d", i), "X-Real-IP", fmt.Sprintf("192.0.2.%d", i),
			"True-Client-IP", fmt.Sprintf("192.0.2.%d", i))
		if w.Code == 200 {
			allowed++
		}
	}
	if allowed != 1 {
		t.Errorf("rotating Forwarded, X-Real-IP and True-Client-IP: %d of 20 allowed at 1 per minute", allowed)
	}
}

// proxyRequest is what httputil.ReverseProxy hands Rewrite: Out is In
// without the forwarding headers.
func proxyRequest(remote string, hdr ...string) *httputil.ProxyRequest {
	in := httptest.NewRequest("GET", "http://app.test/x", nil)
	in.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		in.Header.Add(hdr[i], hdr[i+1])
	}
	out := in.Clone(in.Context())
	for _, h := range []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		out.Header.Del(h)
	}
	return &httputil.ProxyRequest{In: in, Out: out}
}

// The upstream learns the client as a standard reverse proxy tells it.
func TestSetForwarded(t *testing.T) {
	for _, c := range []struct {
		name, source, remote string
		hdr                  []string
		want                 map[string]string
	}{
		{"trusted peer: the chain grows", "", "10.0.0.5:1", []string{"X-Forwarded-For", "1.1.1.1, 2.2.2.2", "X-Forwarded-Proto", "https", "X-Forwarded-Host", "shop.test"},
			map[string]string{"X-Forwarded-For": "1.1.1.1, 2.2.2.2, 10.0.0.5", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "shop.test", "X-Real-Ip": "2.2.2.2"}},
		{"two XFF lines from a trusted peer", "", "10.0.0.5:1", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-For", "2.2.2.2"},
			map[string]string{"X-Forwarded-For": "1.1.1.1, 2.2.2.2, 10.0.0.5", "X-Real-Ip": "2.2.2.2"}},
		{"untrusted peer: the chain is replaced", "", "203.0.113.9:1", []string{"X-Forwarded-For", "1.1.1.1", "X-Forwarded-Proto", "https", "X-Real-IP", "6.6.6.6"},
			map[string]string{"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http", "X-Forwarded-Host": "app.test", "X-Real-Ip": "203.0.113.9"}},
		{"Forwarded as the source", "forwarded", "10.0.0.5:1", []string{"Forwarded", "for=198.51.100.2;proto=https"},
			map[string]string{"Forwarded": "for=198.51.100.2;proto=https, for=10.0.0.5;proto=http", "X-Real-Ip": "198.51.100.2"}},
		{"Forwarded from an untrusted peer", "forwarded", "[2001:db8::9]:1", []string{"Forwarded", "for=6.6.6.6"},
			map[string]string{"Forwarded": `for="[2001:db8::9]";proto=http`, "X-Real-Ip": "2001:db8::9"}},
		{"a single-address source is removed from an untrusted peer", "header:CF-Connecting-IP", "203.0.113.9:1", []string{"CF-Connecting-IP", "6.6.6.6"},
			map[string]string{"Cf-Connecting-Ip": "", "X-Real-Ip": "203.0.113.9"}},
		{"and kept from a trusted one", "header:CF-Connecting-IP", "10.0.0.5:1", []string{"CF-Connecting-IP", "198.51.100.3"},
			map[string]string{"Cf-Connecting-Ip": "198.51.100.3", "X-Real-Ip": "198.51.100.3"}},
	} {
		h := newHarness(t, fmt.Sprintf("client_ip: {trusted_proxies: [10.0.0.0/8], source: %q, set_header: X-Real-IP}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", c.source))
		pr := proxyRequest(c.remote, c.hdr...)
		h.mw.SetForwarded(pr)
		for k, v := range c.want {
			if got := strings.Join(pr.Out.Header.Values(k), ", "); got != v {
				t.Errorf("%s: %s: %q, want %q", c.name, k, got, v)
			}
		}
	}
}

// pathHarness is a proxy in front of an upstream that records the paths it
// serves.
type pathHarness struct {
	*harness
	mu    sync.Mutex
	paths []string
}

func newPathHarness(t *testing.T, yaml string) *pathHarness {
	ph := &pathHarness{harness: newHarness(t, yaml)}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ph.mu.Lock()
		ph.paths = append(ph.paths, r.URL.EscapedPath())
		ph.mu.Unlock()
	})
	mw, err := New(ph.mw.state.Load().cfg, up, Options{Clock: ph.clk, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mw.Close() })
	ph.mw = mw
	return ph
}

// get sends a request line's target as a client would put it on the wire.
func (ph *pathHarness) get(target string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "http://api.test"+target, nil)
	r.RemoteAddr = "198.51.100.1:1"
	w := httptest.NewRecorder()
	ph.mw.ServeHTTP(w, r)
	return w
}

func (ph *pathHarness) last() string {
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if len(ph.paths) == 0 {
		return ""
	}
	return ph.paths[len(ph.paths)-1]
}

// Once the /api/ limit is spent, no spelling of /api/x reaches the upstream,
// and what does reach it is the path the rule matched.
func TestPathSpellingsDoNotEvadeRules(t *testing.T) {
	ph := newPathHarness(t, "rules:\n  - name: api\n    match: {path_prefix: /api/}\n    limits: [{requests: 2, per: 1m}]\n")
	for _, c := range []struct{ target, upstream string }{
		{"/api/x", "/api/x"},
		{"//api//./x/", "/api/x/"},
	} {
		if w := ph.get(c.target); w.Code != 200 || ph.last() != c.upstream {
			t.Fatalf("%s: %d, upstream served %q, want %q", c.target, w.Code, ph.last(), c.upstream)
		}
	}
	for _, c := range []struct {
		target string
		code   int
	}{
		{"/api/x", 429},
		{"//api/x", 429},
		{"/./api/x", 429},
		{"/x/../api/x", 429},
		{"/../../api/x", 429},
		{"/%2e%2e/api/x", 429},
		{"/%61pi/x", 429},
		{"/API/x", 429},
		{"/Api/x", 429},
		{"/api", 429},
		{"/%2Fapi/x", 400},
		{"/%2fapi/x", 400},
		{"/api%2Fx", 400},
		{"/%5Capi/x", 400},
		{"/\\api/x", 400},
		{"/api/%00x", 400},
		{"/api/x%0d%0a", 400},
		{"/x/..;/api/x", 400},
		{"/x/.;/api/x", 400},
	} {
		before := len(ph.paths)
		w := ph.get(c.target)
		if w.Code != c.code {
			t.Errorf("%s: %d, want %d: %s", c.target, w.Code, c.code, w.Body.String())
		}
		if len(ph.paths) != before {
			t.Errorf("%s reached the upstream as %q", c.target, ph.last())
		}
	}
	// Outside the prefix: served, and a segment prefix does not match a
	// longer name.
	for _, c := range []struct{ target, upstream string }{
		{"/apix", "/apix"},
		{"/api/../other", "/other"},
		{"/docs/a%20b", "/docs/a%20b"},
		{"/docs/caf%C3%A9", "/docs/caf%C3%A9"},
	} {
		if w := ph.get(c.target); w.Code != 200 || ph.last() != c.upstream {
			t.Errorf("%s: %d, upstream served %q, want %q", c.target, w.Code, ph.last(), c.upstream)
		}
	}
	// case_sensitive: /API/ is another path.
	cs := newPathHarness(t, "rules:\n  - name: api\n    match: {path_prefix: /api/, case_sensitive: true}\n    limits: [{requests: 1, per: 1m}]\n")
	cs.get("/api/x")
	if w := cs.get("/API/x"); w.Code != 200 {
		t.Errorf("case_sensitive: /API/x %d", w.Code)
	}
}

// Keys never reach /metrics or the logs as bytes a client chose, and no key
// breaks the scrape.
func TestHostileKeysInMetricsAndLogs(t *testing.T) {
	var logs syncBuffer
	cfg, err := ParseConfig("t", []byte("rules:\n  - name: q\n    key: [\"query:k\"]\n    limits: [{requests: 1, per: 1m}]\n  - name: h\n    key: [\"header:X-Key\"]\n    limits: [{requests: 1, per: 1m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Clock: epochsketch.NewManualClock(t0), Seed: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	hostile := []string{
		"\xff\xfe\xfd", "a\"b", `a\b`, "a\nb", "a\x00b", "\x1b[31mred", "€" + strings.Repeat("€", 40) + "\xe2\x82",
		"} 1\nfake_metric 9", "k=\"v\",x", strings.Repeat("x", 5000), "日本語",
	}
	for _, k := range hostile {
		for range 4 {
			r := httptest.NewRequest("GET", "/?k="+urlQueryEscape(k), nil)
			r.Header["X-Key"] = []string{k}
			mw.ServeHTTP(httptest.NewRecorder(), r)
		}
	}
	fams := scrape(t, mw)
	if f := fams["sketchproxy_top_offender_level"]; f == nil || len(f.Metric) < 2*len(hostile)-2 {
		t.Errorf("top offenders: %v", f)
	}
	if fams["fake_metric"] != nil {
		t.Error("a key injected a metric")
	}
	w := httptest.NewRecorder()
	mw.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	for _, k := range hostile {
		for _, part := range []string{k, strconv.Quote(k)} {
			if len(k) > 2 && (strings.Contains(w.Body.String(), part) || strings.Contains(logs.String(), part)) {
				t.Errorf("key %q appears in /metrics or the logs", k)
			}
		}
	}
	if !strings.Contains(logs.String(), "key=k:") {
		t.Errorf("no hashed key in the logs:\n%.500s", logs.String())
	}
}

func urlQueryEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// A fresh proxy in front of steady clients refuses none of them, and a
// rotation attack after the warm-up still meets the stricter budget; a
// restart with the state file needs no warm-up.
func TestNewKeysRestartAndRotation(t *testing.T) {
	dir := t.TempDir()
	yaml := "state_file: " + filepath.Join(dir, "state") + `
new_keys: {min_per_second: 50, spike_factor: 4, budget_factor: 0.25, window: 1m}
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{requests: 20, per: 1m}]
`
	clk := epochsketch.NewManualClock(t0)
	run := func(mw *Middleware, seconds int, attack int, stats map[string][2]int) {
		n := 0
		for s := range seconds {
			// 100 steady clients at 40% of the limit: 8 a minute each, one
			// every 7.5 s, all arriving in the same seconds.
			for c := range 100 {
				if (s*2+c%15)%15 == 0 {
					st := stats["steady"]
					st[1]++
					if codeKey(mw, fmt.Sprint("steady", c)) == 200 {
						st[0]++
					}
					stats["steady"] = st
				}
			}
			// attack new keys a second, 10 requests each.
			for range attack {
				n++
				for range 10 {
					st := stats["rotation"]
					st[1]++
					if codeKey(mw, fmt.Sprintf("rot%d-%d", s, n)) == 200 {
						st[0]++
					}
					stats["rotation"] = st
				}
			}
			clk.Advance(time.Second)
		}
	}
	mw, _ := startWithState(t, yaml, clk)
	first := map[string][2]int{}
	run(mw, 180, 0, first)
	if s := first["steady"]; s[0] != s[1] {
		t.Errorf("fresh proxy, steady clients at 40%%: %d of %d allowed", s[0], s[1])
	}
	attack := map[string][2]int{}
	run(mw, 5, 1000, attack)
	if s := attack["steady"]; s[0] != s[1] {
		t.Errorf("during the rotation attack, steady clients: %d of %d allowed", s[0], s[1])
	}
	// A quarter of 20: 5 of each new key's 10 requests (the keys of the
	// spike's first second, before the meter sees it, get all 10).
	if r := attack["rotation"]; float64(r[0]) > 0.55*float64(r[1]) {
		t.Errorf("rotation attack: %d of %d allowed, want about half", r[0], r[1])
	}
	t.Logf("fresh start: steady %v; attack: steady %v, rotation %v (allowed, sent)", first["steady"], attack["steady"], attack["rotation"])
	mw.Close()

	// Restart from the state file: no warm-up, the steady clients are known.
	clk.Advance(10 * time.Second)
	mw2, _ := startWithState(t, yaml, clk)
	defer mw2.Close()
	if !mw2.eng.MeterRestored() {
		t.Fatal("the state file did not restore the new-key meter")
	}
	again := map[string][2]int{}
	run(mw2, 5, 1000, again)
	if s := again["steady"]; s[0] != s[1] {
		t.Errorf("after a restart under attack, steady clients: %d of %d allowed", s[0], s[1])
	}
	if r := again["rotation"]; float64(r[0]) > 0.55*float64(r[1]) {
		t.Errorf("after a restart, rotation attack: %d of %d allowed", r[0], r[1])
	}
	t.Logf("after restart, under attack: steady %v, rotation %v", again["steady"], again["rotation"])
}

// Refused requests are free by default (a client at 4x keeps its limit)
// and count with refused: count (a client at 4x gets far less).
func TestRefusedFreeOrCounted(t *testing.T) {
	for _, c := range []struct {
		refused  string
		min, max float64 // allowed per minute, as a fraction of the limit
	}{
		{"free", 0.95, 1.13}, // the limit, its first minute's burst and package rate's Excess
		{"count", 0, 0.20},
	} {
		h := newHarness(t, fmt.Sprintf("rules:\n  - name: r\n    refused: %s\n    limits: [{requests: 60, per: 1m}]\n", c.refused))
		allowed := 0
		for range 10 * 60 * 4 { // 10 minutes at 4 a second: 4x the limit
			if h.req("203.0.113.1").Code == 200 {
				allowed++
			}
			h.clk.Advance(250 * time.Millisecond)
		}
		got := float64(allowed) / (10 * 60)
		t.Logf("refused: %s, a client at 4x the limit: %d allowed in 10 minutes, %.3f of the limit", c.refused, allowed, got)
		if got < c.min || got > c.max {
			t.Errorf("refused: %s: %.3f of the limit, want %.2f to %.2f", c.refused, got, c.min, c.max)
		}
	}
}

// Waiting exactly Retry-After is enough, on every refusal path: the next
// request is let through by every rule.
func TestRetryAfterIsEnough(t *testing.T) {
	for _, c := range []struct {
		name, yaml string
		outcome    string
		hdr        []string
		warm       bool // push a spike of new keys first
		after      int  // send this many requests, 20 ms apart, before looking
	}{
		{"reject", "rules:\n  - name: r\n    limits: [{requests: 5, per: 10s}]\n", "reject", nil, false, 0},
		{"reject counted", "rules:\n  - name: r\n    refused: count\n    limits: [{requests: 5, per: 10s}]\n", "reject", nil, false, 0},
		{"two limits", "rules:\n  - name: r\n    refused: count\n    limits: [{name: s, requests: 4, per: 2s}, {name: m, requests: 20, per: 1m}]\n", "reject", nil, false, 0},
		{"two rules", "rules:\n  - name: a\n    refused: count\n    limits: [{requests: 4, per: 2s}]\n  - name: b\n    refused: count\n    limits: [{requests: 12, per: 1m}]\n", "reject", nil, false, 0},
		{"two limits, both over", "rules:\n  - name: r\n    refused: count\n    limits: [{name: s, requests: 4, per: 2s}, {name: m, requests: 20, per: 1m}]\n", "reject", nil, false, 150},
		{"two rules, both over", "rules:\n  - name: a\n    refused: count\n    limits: [{requests: 4, per: 2s}]\n  - name: b\n    refused: count\n    limits: [{requests: 12, per: 1m}]\n", "reject", nil, false, 150},
		{"free, two rules over", "rules:\n  - name: a\n    limits: [{requests: 4, per: 2s}]\n  - name: b\n    limits: [{requests: 12, per: 1m}]\n", "reject", nil, false, 150},
		{"drip", "tarpit: {max_delay: 2s, drip_interval: 100ms}\nrules:\n  - name: t\n    tarpit: true\n    limits: [{requests: 10, per: 10s}]\n", "drip", nil, false, 0},
		{"ban", "tarpit: {ban_for: 1m}\nrules:\n  - name: t\n    tarpit: true\n    limits: [{requests: 10, per: 10s}, {name: day, requests: 200, per: 1d}]\n", "ban", nil, false, 0},
		{"wallet", "rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    budget: {units: 1000, per: 1h, cost: 10, reconcile_header: X-Tokens-Used}\n", "over_budget", []string{"X-Key", "a", "X-Test-Tokens", "170"}, false, 0},
		{"wallet and limit", "rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    limits: [{requests: 30, per: 1m}]\n    budget: {units: 1000, per: 1h, cost: 10, reconcile_header: X-Tokens-Used}\n", "over_budget", []string{"X-Key", "a", "X-Test-Tokens", "170"}, false, 0},
		{"new key in a spike", "new_keys: {min_per_second: 20, warmup: 1s}\nrules:\n  - name: n\n    key: [\"header:X-Key\"]\n    limits: [{requests: 40, per: 1m}]\n", "reject", []string{"X-Key", "fresh"}, true, 0},
	} {
		for _, phase := range []time.Duration{0, 137 * time.Millisecond, 499 * time.Millisecond, 999 * time.Millisecond, 4321 * time.Millisecond} {
			h := newHarness(t, c.yaml)
			h.clk.Advance(phase)
			if c.warm {
				h.clk.Advance(2 * time.Second)
				for i := range 100 {
					h.req("198.51.100.1", "X-Key", fmt.Sprint("spike", i))
				}
			}
			hdr := c.hdr
			if hdr == nil {
				hdr = []string{"X-Unused", "1"}
			}
			var w *httptest.ResponseRecorder
			for range c.after {
				h.req("203.0.113.1", hdr...)
				h.clk.Advance(20 * time.Millisecond)
			}
			for i := range 400 {
				if w = h.req("203.0.113.1", hdr...); w.Code != 200 {
					if p := decodeProblem(t, w); p.Outcome == c.outcome {
						break
					}
				}
				if i == 399 {
					t.Fatalf("%s: no %s in 400 requests: %d %s", c.name, c.outcome, w.Code, w.Body.String())
				}
				h.clk.Advance(20 * time.Millisecond)
			}
			ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("%s: Retry-After %q", c.name, w.Header().Get("Retry-After"))
			}
			// Retry-After is never earlier than a RateLimit reset (draft,
			// section 6).
			for name, ps := range policies(t, w.Header().Values("RateLimit")) {
				if tt := ps["t"].(int64); tt > int64(ra) {
					t.Errorf("%s: RateLimit %s t=%d after Retry-After %d", c.name, name, tt, ra)
				}
			}
			t.Logf("%s (phase %v): %s, Retry-After %d", c.name, phase, c.outcome, ra)
			h.clk.Advance(time.Duration(ra) * time.Second)
			if w2 := h.req("203.0.113.1", hdr...); w2.Code != 200 {
				t.Errorf("%s (phase %v): refused with %s after waiting Retry-After %d: %d %s", c.name, phase, c.outcome, ra, w2.Code, w2.Body.String())
			}
		}
	}
}

func parseList(t *testing.T, values []string) httpsfv.List {
	t.Helper()
	if len(values) == 0 {
		return nil
	}
	l, err := httpsfv.UnmarshalList(values)
	if err != nil {
		t.Fatalf("%q is not a structured-field List: %v", values, err)
	}
	return l
}

// policies reads RateLimit-Policy or RateLimit as name -> parameters.
func policies(t *testing.T, values []string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, m := range parseList(t, values) {
		it, ok := m.(httpsfv.Item)
		if !ok {
			t.Fatalf("%q: an inner list", values)
		}
		name, ok := it.Value.(string)
		if !ok {
			t.Fatalf("%q: the item is not a String", values)
		}
		ps := map[string]any{}
		for _, k := range it.Params.Names() {
			ps[k], _ = it.Params.Get(k)
		}
		out[name] = ps
	}
	return out
}

// The RateLimit headers follow draft-ietf-httpapi-ratelimit-headers-10.
func TestRateLimitHeadersFollowDraft(t *testing.T) {
	// q and w are Integers (3.1.1, 3.1.3): fractional rates and sub-second
	// windows are scaled, not rounded into another limit.
	for _, c := range []struct {
		limit string
		q, w  int64
	}{
		{"{requests: 2.5, per: 1m}", 5, 120},
		{"{requests: 10, per: 500ms}", 20, 1},
		{"{requests: 10, per: 1s, burst: 20}", 10, 1},
		{"{requests: 1, per: 1500ms}", 2, 3},
		{"{requests: 50000, per: 1d}", 50000, 86400},
	} {
		h := newHarness(t, "rules:\n  - name: r\n    limits: ["+c.limit+"]\n")
		w := h.req("203.0.113.1")
		p := policies(t, w.Header().Values("RateLimit-Policy"))
		for _, ps := range p {
			if ps["q"] != c.q || ps["w"] != c.w {
				t.Errorf("%s: RateLimit-Policy %q, want q=%d;w=%d", c.limit, w.Header().Get("RateLimit-Policy"), c.q, c.w)
			}
		}
		// r never above q (4.1.1), even with a burst above q.
		for range 3 {
			for _, ps := range policies(t, w.Header().Values("RateLimit")) {
				if r := ps["r"].(int64); r > c.q || r < 0 {
					t.Errorf("%s: r=%d with q=%d", c.limit, r, c.q)
				}
				if _, ok := ps["t"].(int64); !ok {
					t.Errorf("%s: t is not an Integer", c.limit)
				}
			}
			w = h.req("203.0.113.1")
		}
	}
	// Every policy of every rule that decided is listed; shadow rules add
	// none, and a request only a shadow rule matched carries no headers.
	h := newHarness(t, `rules:
  - name: a
    match: {path_prefix: /v1/}
    limits: [{name: s, requests: 10, per: 1s}, {name: d, requests: 1000, per: 1d}]
  - name: b
    limits: [{name: m, requests: 100, per: 1m}]
  - name: shadow
    shadow: true
    limits: [{name: m, requests: 1, per: 1m}]
`)
	w := h.req("203.0.113.1")
	pol, cur := policies(t, w.Header().Values("RateLimit-Policy")), policies(t, w.Header().Values("RateLimit"))
	for _, name := range []string{"a-s", "a-d", "b-m"} {
		if pol[name] == nil || cur[name] == nil {
			t.Errorf("policy %s missing: RateLimit-Policy %q, RateLimit %q", name, w.Header().Get("RateLimit-Policy"), w.Header().Get("RateLimit"))
		}
	}
	if pol["shadow-m"] != nil || cur["shadow-m"] != nil {
		t.Error("a shadow rule sent headers")
	}
	sh := newHarness(t, "rules:\n  - name: shadow\n    shadow: true\n    limits: [{requests: 1, per: 1m}]\n")
	for range 3 {
		if w := sh.req("203.0.113.1"); w.Code != 200 || w.Header().Get("RateLimit") != "" || w.Header().Get("RateLimit-Policy") != "" {
			t.Errorf("a shadow rollout: %d, RateLimit %q", w.Code, w.Header().Get("RateLimit"))
		}
	}
	// A refusal lists the violated policy with r=0, in the problem too.
	one := newHarness(t, "rules:\n  - name: a\n    limits: [{name: s, requests: 2, per: 10s}, {name: d, requests: 1000, per: 1d}]\n")
	one.req("203.0.113.1")
	one.req("203.0.113.1")
	w = one.req("203.0.113.1")
	cur = policies(t, w.Header().Values("RateLimit"))
	if w.Code != 429 || len(cur) != 1 || cur["a-s"] == nil || cur["a-s"]["r"] != int64(0) {
		t.Errorf("refusal: %d RateLimit %q", w.Code, w.Header().Get("RateLimit"))
	}
	if p := decodeProblem(t, w); p.Type != quotaExceeded || len(p.Violated) != 1 || p.Violated[0] != "a-s" {
		t.Errorf("problem %+v", p)
	}
}
