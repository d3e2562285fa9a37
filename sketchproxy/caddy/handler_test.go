package caddyepochsketch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// config is one Caddy config load: the context its handlers are
// provisioned in (a reload is a new one), cancelled at the test's end.
type config struct {
	t   *testing.T
	ctx caddy.Context
	clk *epochsketch.ManualClock
}

func newConfig(t *testing.T, clk *epochsketch.ManualClock) *config {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	return &config{t, ctx, clk}
}

// provision provisions h in the config, as Caddy would, on the config's
// manual clock, and cleans it up at the test's end (idempotent: a test
// may clean up first, as an old config is after a reload).
func (c *config) provision(h *Handler) *Handler {
	c.t.Helper()
	h.clock, h.seed = c.clk, 1
	if err := h.Provision(c.ctx); err != nil {
		c.t.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		c.t.Fatal(err)
	}
	h.logger = zap.NewNop() // refusals are many here; TestRefusalLog reads the log
	c.t.Cleanup(func() { h.Cleanup() })
	return h
}

// zone is a zone of events per window keyed by X-Key.
func zone(events float64, window time.Duration) *Zone {
	return &Zone{Key: "{http.request.header.X-Key}", Events: events, Window: caddy.Duration(window)}
}

// one is a handler of one zone.
func one(name string, z *Zone) *Handler { return &Handler{Zones: map[string]*Zone{name: z}} }

// request is a GET of target with headers (name, value pairs; a name may
// repeat), in a context as Caddy's server prepares it.
func request(target string, header ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://example.com"+target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Add(header[i], header[i+1])
	}
	return prepared(r)
}

func prepared(r *http.Request) *http.Request {
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	caddyhttp.NewTestReplacer(r)
	return r
}

// result is what a chain of handlers did with a request.
type result struct {
	*httptest.ResponseRecorder
	err     error
	reached *http.Request // what the next handler got; nil if it was not called
}

// serve runs r through the handlers in order, as a Caddy route would, in
// front of a handler that answers 200.
func serve(hs []*Handler, r *http.Request) *result {
	res := &result{ResponseRecorder: httptest.NewRecorder()}
	var next caddyhttp.Handler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		res.reached = r
		w.WriteHeader(http.StatusOK)
		return nil
	})
	for i := len(hs) - 1; i >= 0; i-- {
		h, after := hs[i], next
		next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, after) })
	}
	res.err = next.ServeHTTP(res, r)
	return res
}

func codes(hs []*Handler, n int, target string, header ...string) string {
	var cs []string
	for range n {
		cs = append(cs, fmt.Sprint(serve(hs, request(target, header...)).Code))
	}
	return strings.Join(cs, " ")
}

// Two stacked handlers from many goroutines (under -race in make test):
// each key gets exactly its limit of the stricter zone, and every answer
// carries both zones' policies. (Each handler decides alone: the outer one
// counts the requests the inner one refuses, so 6 stay within its 8.)
func TestStackedHandlersConcurrent(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	hs := []*Handler{c.provision(one("outer", zone(8, time.Hour))), c.provision(one("inner", zone(4, time.Hour)))}
	const keys, each = 16, 6
	var wg sync.WaitGroup
	admitted := make([]int, keys)
	errs := make(chan string, keys)
	for k := range keys {
		wg.Go(func() {
			for range each {
				w := serve(hs, request("/x?y=1", "X-Key", fmt.Sprintf("key-%d", k)))
				if w.Code == http.StatusOK {
					admitted[k]++
				}
				pol := w.Header().Get("RateLimit-Policy")
				if !strings.Contains(pol, `"outer-`) || !strings.Contains(pol, `"inner-`) {
					errs <- fmt.Sprintf("%d: RateLimit-Policy %q: want both zones", w.Code, pol)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for k, n := range admitted {
		if n != 4 {
			t.Errorf("key-%d: %d of %d admitted, want 4 (the inner zone's limit)", k, n, each)
		}
	}
}

// The zones of one directive are one decision: a request one zone refuses
// is counted by none, and the refusal's Retry-After covers every zone.
func TestZonesOneDecision(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(&Handler{Zones: map[string]*Zone{"wide": zone(5, time.Hour), "tight": zone(2, time.Hour)}})
	if got := codes([]*Handler{h}, 4, "/", "X-Key", "k"); got != "200 200 429 429" {
		t.Fatalf("4 requests, zones of 5 and 2: %s", got)
	}
	w := serve([]*Handler{h}, request("/", "X-Key", "k"))
	// wide counted 2 (the admitted ones), so it still has 3 left.
	if !strings.Contains(w.Header().Get("RateLimit"), `"tight-per-1h";r=0`) || strings.Contains(w.Header().Get("RateLimit"), `"wide-`) {
		t.Errorf("the refusal's RateLimit %q: want the tight zone alone, at 0", w.Header().Get("RateLimit"))
	}
	if pol := w.Header().Get("RateLimit-Policy"); !strings.Contains(pol, `"wide-per-1h";q=5;w=3600`) || !strings.Contains(pol, `"tight-per-1h";q=2;w=3600`) {
		t.Errorf("RateLimit-Policy %q: want both zones' policies", pol)
	}
	if w.Header().Get("Retry-After") == "" {
		t.Error("a refusal without Retry-After")
	}
}

// A reload keeps every zone whose definition did not change, whatever
// happened to the others, and frees a zone once no config uses it.
func TestReloadKeepsEachZone(t *testing.T) {
	clk := epochsketch.NewManualClock(t0)
	old := newConfig(t, clk)
	a := old.provision(&Handler{Zones: map[string]*Zone{"kept": zone(3, time.Hour), "changed": zone(3, time.Hour)}})
	if got := codes([]*Handler{a}, 4, "/", "X-Key", "k"); got != "200 200 200 429" {
		t.Fatalf("4 requests at 3: %s", got)
	}
	// The reload: the new config is provisioned before the old one is
	// cleaned up.
	b := newConfig(t, clk).provision(&Handler{Zones: map[string]*Zone{"kept": zone(3, time.Hour), "changed": zone(4, time.Hour)}})
	if b.zones[1].state != a.zones[1].state {
		t.Fatal("the unchanged zone got new counts")
	}
	if b.zones[0].state == a.zones[0].state {
		t.Fatal("the changed zone kept the old definition's counts")
	}
	oldChanged := a.zones[0].poolKey
	a.Cleanup()
	w := serve([]*Handler{b}, request("/", "X-Key", "k"))
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Header().Get("RateLimit"), `"kept-per-1h";r=0`) {
		t.Errorf("after the reload: %d, RateLimit %q; want 429 by the kept zone, whose counts stayed", w.Code, w.Header().Get("RateLimit"))
	}
	if n, ok := zones.References(b.zones[1].poolKey); !ok || n != 1 {
		t.Errorf("references to the kept zone: %d, %v; want 1", n, ok)
	}
	if _, ok := zones.References(oldChanged); ok {
		t.Error("the changed zone's old counts stay in the pool after the old config's cleanup")
	}
	key := b.zones[1].poolKey
	b.Cleanup()
	if _, ok := zones.References(key); ok {
		t.Error("a zone stays in the pool after its last config's cleanup")
	}
}

// Identical zones in two places count apart, and keep their own counts
// across a reload; zones marked shared are one count.
func TestPlacesCountApart(t *testing.T) {
	clk := epochsketch.NewManualClock(t0)
	c := newConfig(t, clk)
	a, b := c.provision(one("per_key", zone(2, time.Hour))), c.provision(one("per_key", zone(2, time.Hour)))
	if got := codes([]*Handler{a}, 3, "/", "X-Key", "k"); got != "200 200 429" {
		t.Fatalf("the first place: %s", got)
	}
	if got := codes([]*Handler{b}, 1, "/", "X-Key", "k"); got != "200" {
		t.Fatalf("the second place after the first's limit: %s, want 200 (its own count)", got)
	}
	r := newConfig(t, clk)
	a2, b2 := r.provision(one("per_key", zone(2, time.Hour))), r.provision(one("per_key", zone(2, time.Hour)))
	if a2.zones[0].state != a.zones[0].state || b2.zones[0].state != b.zones[0].state {
		t.Error("a reload mixed up two places' counts")
	}
	sh := func() *Handler { z := zone(2, time.Hour); z.Shared = true; return one("per_key", z) }
	s1, s2 := c.provision(sh()), c.provision(sh())
	if got := codes([]*Handler{s1}, 2, "/", "X-Key", "k") + " " + codes([]*Handler{s2}, 1, "/", "X-Key", "k"); got != "200 200 429" {
		t.Errorf("two shared zones: %s, want 200 200 429 (one count)", got)
	}
}

// A key header sent twice counts under its first value: no junk second
// value makes a new key (issue 38: 8 requests at a limit of 3 were 8
// admitted).
func TestDoubledHeaderIsNoNewKey(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("api", zone(3, time.Hour)))
	admitted := 0
	for i := range 8 {
		if serve([]*Handler{h}, request("/", "X-Key", "alice", "X-Key", fmt.Sprintf("junk%d", i))).Code == 200 {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("alice with a junk second value: %d of 8 admitted, want 3", admitted)
	}
	if got := codes([]*Handler{h}, 1, "/", "X-Key", "alice"); got != "429" {
		t.Errorf("alice alone then: %s, want 429 (the same key)", got)
	}
}

// A query parameter or cookie key given twice is refused with 400, which
// names the zone; given once it is the key.
func TestDoubledQueryOrCookieKey(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(&Handler{Zones: map[string]*Zone{
		"q": {Key: "{http.request.uri.query.key}", Events: 1, Window: caddy.Duration(time.Hour)},
		"c": {Key: "{http.request.cookie.session}", Events: 5, Window: caddy.Duration(time.Hour)},
	}})
	for _, tc := range []struct {
		target, cookie, want string
	}{
		{"/?key=a&key=b", "", `zone \"q\": the key parameter \"key\" is given 2 times`},
		{"/?key=c", "session=x; SESSION=y", `zone \"c\": the key cookie \"session\" is sent 2 times`},
	} {
		r := request(tc.target)
		if tc.cookie != "" {
			r.Header.Set("Cookie", tc.cookie)
		}
		w := serve([]*Handler{h}, r)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), tc.want) || w.reached != nil {
			t.Errorf("%s with cookie %q: %d %q, reached next %v; want 400 naming %s", tc.target, tc.cookie, w.Code, w.Body, w.reached != nil, tc.want)
		}
	}
	if got := codes([]*Handler{h}, 2, "/?key=d"); got != "200 429" {
		t.Errorf("?key=d twice at 1 an hour: %s", got)
	}
}

// The next handler gets the request as Caddy gave it: path, method and
// headers untouched, whatever their spelling; nothing no zone asked for
// is refused.
func TestRequestUnchanged(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("z", zone(100, time.Hour)))
	for _, tc := range []struct{ method, target string }{
		{"GET", "/ip//a/./b/../c"},
		{"GET", "/a%2Fb"},
		{"TRACE", "/"},
		{"get", "/x"},
		{"GET", "/api;a=1/x"},
	} {
		r := httptest.NewRequest(tc.method, "http://example.com"+tc.target, nil)
		r.Header.Set("X-Key", "k")
		r.Header.Set("Epochsketch-Zone-0", "chosen")
		path, raw := r.URL.Path, r.URL.RawPath
		w := serve([]*Handler{h}, prepared(r))
		if w.Code != 200 || w.reached == nil {
			t.Errorf("%s %s: %d, want 200 from the next handler", tc.method, tc.target, w.Code)
			continue
		}
		got := w.reached
		if got.Method != tc.method || got.URL.Path != path || got.URL.RawPath != raw || got.Header.Get("Epochsketch-Zone-0") != "chosen" || len(got.Header) != 2 {
			t.Errorf("%s %s reached next as %s %q (raw %q) with headers %v", tc.method, tc.target, got.Method, got.URL.Path, got.URL.RawPath, got.Header)
		}
	}
}

// Where error routes exist, a refusal is a 429 error with Retry-After and
// the RateLimit fields already set, the placeholders for the routes set,
// and nothing written; the next handler is not called.
func TestRefusalAsError(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("api", zone(1, time.Minute)))
	h.asErrors = returnRefusals // as Provision sets it under a subroute with error routes
	serve([]*Handler{h}, request("/", "X-Key", "k"))
	r := request("/", "X-Key", "k")
	w := serve([]*Handler{h}, r)
	var he caddyhttp.HandlerError
	if !errors.As(w.err, &he) || he.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("the refusal returned %v, want a 429 HandlerError", w.err)
	}
	if w.reached != nil || w.Body.Len() != 0 || w.Code != 200 { // 200: the recorder's, nothing written
		t.Errorf("the refusal wrote %d %q, or reached next (%v)", w.Code, w.Body, w.reached != nil)
	}
	hd := w.Header()
	// 1 a minute: a tick of 37.2 s, from the start of the step the first
	// request counted in.
	if hd.Get("Retry-After") != "37" || !strings.Contains(hd.Get("RateLimit"), `"api-per-1m";r=0;t=37`) || !strings.Contains(hd.Get("RateLimit-Policy"), `"api-per-1m";q=1;w=60`) {
		t.Errorf("headers for the error routes: %v", hd)
	}
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if z, _ := repl.GetString(zonePlaceholder); z != "api" {
		t.Errorf("{%s} = %q, want api", zonePlaceholder, z)
	}
	if s, _ := repl.GetString(retryPlaceholder); s != "37" {
		t.Errorf("{%s} = %q, want 37", retryPlaceholder, s)
	}
	if !strings.Contains(he.Err.Error(), `zone "api": 1 requests per 1m0s; retry after 37 s`) {
		t.Errorf("the error's message %q", he.Err)
	}
}

// Without error routes the handler writes the refusal itself: 429,
// Retry-After, the RateLimit fields and a problem+json body.
func TestRefusalWritten(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("api", zone(1, time.Minute)))
	serve([]*Handler{h}, request("/", "X-Key", "k"))
	w := serve([]*Handler{h}, request("/", "X-Key", "k"))
	body, _ := io.ReadAll(w.Body)
	if w.err != nil || w.Code != 429 || w.reached != nil || w.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(string(body), `"violated-policies":["api-per-1m"]`) || w.Header().Get("Retry-After") != "37" {
		t.Errorf("%v %d %v %s", w.err, w.Code, w.Header(), body)
	}
}

// A refusal of an HTTP/2 request with a body ends that stream alone (issue
// 46): Connection: close, which an HTTP/1 refusal needs so that the server
// does not wait for the unread body, makes Go's HTTP/2 server (Caddy's)
// send GOAWAY, and the next request on the connection would have to open
// another.
func TestHTTP2RefusalKeepsConnection(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("api", zone(1, time.Minute)))
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	testkit.PostsOnOneConnection(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h.ServeHTTP(w, prepared(r), next); err != nil {
			t.Error(err)
		}
	}), []testkit.Post{
		{Name: "a POST", Key: "a", Want: 200},
		{Name: "a POST over its limit", Key: "a", Want: 429},
		{Name: "a POST of another key", Key: "b", Want: 200},
	})
	// HTTP/1 still closes.
	r := prepared(httptest.NewRequest("POST", "http://example.com/", strings.NewReader("body")))
	r.Header.Set("X-Key", "a")
	if w := serve([]*Handler{h}, r); w.Code != 429 || w.Header().Get("Connection") != "close" {
		t.Errorf("an HTTP/1 POST over its limit: %d, Connection %q; want 429 and close", w.Code, w.Header().Get("Connection"))
	}
}

// Jitter lengthens Retry-After by up to its fraction; the RateLimit
// field's wait stays exact.
func TestJitter(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := &Handler{Zones: map[string]*Zone{"api": zone(1, 100*time.Second)}, Jitter: 0.5}
	h.rand = func() float64 { return 0.5 }
	c.provision(h)
	serve([]*Handler{h}, request("/", "X-Key", "k"))
	w := serve([]*Handler{h}, request("/", "X-Key", "k"))
	// 1 per 100 s: a wait of 60 s (a tick of 62 s, from the start of the
	// step the first request counted in).
	if w.Header().Get("Retry-After") != "75" || !strings.Contains(w.Header().Get("RateLimit"), ";t=60") {
		t.Errorf("jitter 0.5 drawn at 0.5 on a wait of 60 s: Retry-After %q, RateLimit %q; want 75 and t=60",
			w.Header().Get("Retry-After"), w.Header().Get("RateLimit"))
	}
}

// A zone's match block selects what it counts.
func TestZoneMatch(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	z := zone(1, time.Hour)
	z.MatcherSetsRaw = caddyhttp.RawMatcherSets{{"path": []byte(`["/api/*"]`)}}
	h := c.provision(one("api", z))
	if got := codes([]*Handler{h}, 2, "/api/x", "X-Key", "k") + " " + codes([]*Handler{h}, 2, "/other", "X-Key", "k"); got != "200 429 200 200" {
		t.Errorf("/api/x twice, /other twice, at 1 an hour on /api/*: %s", got)
	}
}

func TestClientPrefix(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"", "-"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: tc.ip}))
		if got := clientPrefix(r); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.ip, got, tc.want)
		}
	}
}

// A zone keyed on {http.epochsketch.client_prefix}: two addresses of one
// IPv6 /64 share a count, another /64 has its own.
func TestClientPrefixZone(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(one("net", &Zone{Key: "{http.epochsketch.client_prefix}", Events: 1, Window: caddy.Duration(time.Hour)}))
	var got []int
	for _, ip := range []string{"2001:db8::1", "2001:db8::2", "2001:db8:0:1::1"} {
		r := request("/")
		caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, ip)
		got = append(got, serve([]*Handler{h}, r).Code)
	}
	if fmt.Sprint(got) != "[200 429 200]" {
		t.Errorf("one /64 twice, then another /64: %v, want [200 429 200]", got)
	}
}

func TestParseKey(t *testing.T) {
	kt, err := parseKey(`{remote_host}/{http.request.header.x-api-key}/{http.request.uri.query.k}/{http.request.cookie.s}\{x}`)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{0 {remote_host}/} {104 X-Api-Key} {0 /} {113 k} {0 /} {99 s} {0 \{x}}]`
	if got := fmt.Sprint(kt); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if _, err := parseKey("{remote_host"); err == nil {
		t.Error("an unclosed placeholder was taken")
	}
}

// A refusal is logged at info level with its zone and a hash of its key
// (the key itself with log_key), at most logsPerSecond lines a second per
// zone; the next second's first line says how many were left out.
func TestRefusalLog(t *testing.T) {
	for _, logKey := range []bool{false, true} {
		clk := epochsketch.NewManualClock(t0)
		c := newConfig(t, clk)
		h := c.provision(&Handler{Zones: map[string]*Zone{"api": zone(1, time.Hour)}, LogKey: logKey})
		core, logs := observer.New(zap.InfoLevel)
		h.logger = zap.New(core)
		for range logsPerSecond + 6 {
			// From 192.0.2.7 behind a trusted proxy at 10.0.0.1: Caddy's
			// {client_ip} is the client's.
			r := request("/", "X-Key", "secret-key")
			r.RemoteAddr = "10.0.0.1:4321"
			caddyhttp.SetVar(r.Context(), caddyhttp.ClientIPVarKey, "192.0.2.7")
			serve([]*Handler{h}, r)
		}
		clk.Advance(time.Second)
		codes([]*Handler{h}, 1, "/", "X-Key", "secret-key")
		lines := logs.FilterMessage("epochsketch refusal").All()
		if len(lines) != logsPerSecond+1 {
			t.Fatalf("log_key %v: %d lines for %d refusals in one second and 1 in the next, want %d", logKey, len(lines), logsPerSecond+5, logsPerSecond+1)
		}
		f := lines[0].ContextMap()
		wantKey := display("secret-key")
		if logKey {
			wantKey = "secret-key"
		}
		if f["zone"] != "api" || f["key"] != wantKey || f["retry_after_s"] != int64(2212) ||
			f["client_ip"] != "192.0.2.7" || f["remote_ip"] != "10.0.0.1" {
			t.Errorf("log_key %v: %v", logKey, f)
		}
		if n := lines[logsPerSecond].ContextMap()["log_lines_skipped"]; n != int64(5) {
			t.Errorf("log_key %v: the next second's line says %v were left out, want 5", logKey, n)
		}
	}
}

// Each zone holds one sketch of sketch_buckets × 64 bytes, allocated when
// it is provisioned; the side sketches (keys seen lately, of the same
// size; new keys and bans, 4096 buckets each) are shared by every zone of
// the same sketch size and new-key setting.
// BENCHMARKS.md's memory per zone (SketchProxy: the Caddy module) is
// this test's log line:
//
//	go test -run TestZoneMemory -v .
func TestZoneMemory(t *testing.T) {
	c := newConfig(t, epochsketch.NewManualClock(t0))
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	for _, buckets := range []int{1 << 12, 1 << 16} {
		start := heap()
		c.provision(&Handler{Zones: map[string]*Zone{"warm": zone(5, time.Minute)}, SketchBuckets: buckets})
		before := heap()
		const n = 8
		zs := map[string]*Zone{}
		for i := range n {
			zs[fmt.Sprintf("z%d", i)] = zone(float64(5+i), time.Minute)
		}
		h := c.provision(&Handler{Zones: zs, SketchBuckets: buckets})
		per := float64(heap()-before) / n
		side := float64(before-start) - per // the first zone of this size brought the side sketches
		t.Logf("sketch_buckets %d: %.0f bytes a zone (%.2f MiB; the sketch alone is %d × 64 bytes = %.2f MiB); the side sketches %.2f MiB",
			buckets, per, per/(1<<20), buckets, float64(buckets*64)/(1<<20), side/(1<<20))
		if want := float64(buckets * 64); per < want || per > want*1.1+64<<10 {
			t.Errorf("sketch_buckets %d: %.0f bytes a zone, want the sketch's %.0f and little more", buckets, per, want)
		}
		runtime.KeepAlive(h)
	}
}
