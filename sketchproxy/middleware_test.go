package sketchproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/jwtauth"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var t0 = time.Unix(1_700_000_000, 0)

type harness struct {
	t        *testing.T
	mw       *Middleware
	clk      *epochsketch.ManualClock
	upstream atomic.Int64
	sleep    atomic.Pointer[func(context.Context, time.Duration) error]
	mu       sync.Mutex
	slept    []time.Duration
}

func newHarness(t *testing.T, yaml string) *harness {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clk: epochsketch.NewManualClock(t0)}
	noSleep := func(context.Context, time.Duration) error { return nil }
	h.sleep.Store(&noSleep)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.upstream.Add(1)
		if v := r.Header.Get("X-Test-Tokens"); v != "" {
			w.Header().Set("X-Tokens-Used", v)
		}
		if r.Header.Get("X-Test-Block") != "" {
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "upstream ok\n")
	})
	h.mw, err = New(cfg, up, Options{
		Clock: h.clk, Seed: 1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Sleep: func(ctx context.Context, d time.Duration) error {
			h.mu.Lock()
			h.slept = append(h.slept, d)
			h.mu.Unlock()
			return (*h.sleep.Load())(ctx, d)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.mw.Close() })
	if v := h.mw.state.Load().jwt; v != nil {
		if f, ok := v.Fetcher(); ok {
			waitJWKS(t, f)
		}
	}
	return h
}

// waitJWKS waits for a key set's first fetch: a start never waits for it.
func waitJWKS(t *testing.T, f jwtauth.Fetcher) {
	t.Helper()
	select {
	case <-f.Ready():
	case <-time.After(30 * time.Second):
		t.Fatalf("the key set at %s was not fetched in 30 s", f.URL())
	}
}

// jwksOf is the fetch loop of mw's running verifier.
func jwksOf(t *testing.T, mw *Middleware) jwtauth.Fetcher {
	t.Helper()
	f, ok := mw.state.Load().jwt.Fetcher()
	if !ok {
		t.Fatal("the running jwt section fetches no jwks_url")
	}
	return f
}

// do serves r and returns the recorded answer.
func (h *harness) do(r *http.Request) *httptest.ResponseRecorder {
	if r.RemoteAddr == "192.0.2.1:1234" { // httptest's default: a client of its own
		r.RemoteAddr = "198.51.100.1:1234"
	}
	w := httptest.NewRecorder()
	h.mw.ServeHTTP(w, r)
	return w
}

func (h *harness) req(remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "http://api.test/v1/x", nil)
	r.RemoteAddr = remote + ":1234"
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.mw.ServeHTTP(w, r)
	return w
}

func (h *harness) reqPath(path string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "http://api.test"+path, nil)
	r.RemoteAddr = "198.51.100.1:1234"
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.mw.ServeHTTP(w, r)
	return w
}

func decodeProblem(t *testing.T, w *httptest.ResponseRecorder) problem {
	t.Helper()
	var p problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return p
}

func TestRejectWithHeadersAndProblem(t *testing.T) {
	h := newHarness(t, "headers: {legacy: true}\nrules:\n  - name: api\n    limits:\n      - {name: per-10s, requests: 5, per: 10s}\n")
	for i := range 5 {
		w := h.req("203.0.113.1")
		if w.Code != 200 {
			t.Fatalf("request %d: %d", i+1, w.Code)
		}
		if want := fmt.Sprintf(`"api-per-10s";r=%d;t=`, 4-i); !strings.HasPrefix(w.Header().Get("RateLimit"), want) {
			t.Errorf("request %d: RateLimit %q, want %s...", i+1, w.Header().Get("RateLimit"), want)
		}
	}
	w := h.req("203.0.113.1")
	if w.Code != 429 {
		t.Fatalf("6th request: %d", w.Code)
	}
	hd := w.Header()
	if hd.Get("Content-Type") != "application/problem+json" || hd.Get("RateLimit-Policy") != `"api-per-10s";q=5;w=10` {
		t.Errorf("headers %v", hd)
	}
	ra, err := strconv.Atoi(hd.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 10 {
		t.Errorf("Retry-After %q", hd.Get("Retry-After"))
	}
	if !strings.HasPrefix(hd.Get("RateLimit"), `"api-per-10s";r=0;t=`+strconv.Itoa(ra)) {
		t.Errorf("RateLimit %q with Retry-After %d", hd.Get("RateLimit"), ra)
	}
	if hd.Get("X-RateLimit-Limit") != "5" || hd.Get("X-RateLimit-Remaining") != "0" || hd.Get("X-RateLimit-Reset") != strconv.Itoa(ra) {
		t.Errorf("legacy headers %v", hd)
	}
	p := decodeProblem(t, w)
	if p.Status != 429 || p.Rule != "api" || p.Limit != "per-10s" || p.Outcome != "reject" || p.RetryAfter != int64(ra) {
		t.Errorf("problem %+v", p)
	}
	if h.upstream.Load() != 5 {
		t.Errorf("upstream saw %d requests, want 5", h.upstream.Load())
	}
	if w := h.req("203.0.113.2"); w.Code != 200 {
		t.Errorf("another client: %d", w.Code)
	}
	// Waiting out Retry-After lets the next request through.
	h.clk.Advance(time.Duration(ra) * time.Second)
	if w := h.req("203.0.113.1"); w.Code != 200 {
		t.Errorf("after Retry-After: %d", w.Code)
	}
}

func TestShadowAndAllowlist(t *testing.T) {
	h := newHarness(t, `rules:
  - name: shadowed
    shadow: true
    limits: [{requests: 2, per: 10s}]
  - name: real
    key: ["header:X-Key"]
    allow: {cidrs: ["192.0.2.0/24"], keys: ["vip"]}
    limits: [{requests: 3, per: 10s}]
`)
	for range 10 {
		if w := h.req("192.0.2.9", "X-Key", "k1"); w.Code != 200 {
			t.Fatalf("allowlisted CIDR refused: %d", w.Code)
		}
		if w := h.req("198.51.100.1", "X-Key", "vip"); w.Code != 200 {
			t.Fatalf("allowlisted key refused: %d", w.Code)
		}
	}
	st := h.mw.state.Load()
	real := st.rules[1].eng
	if e := h.mw.eng.Estimate(real, real.Limits[0], "vip"); e != 0 {
		t.Errorf("an allowlisted key cost sketch work: estimate %d", e)
	}
	shadow := st.rules[0].eng.Counts.Get(engine.Reject, true)
	if shadow == 0 {
		t.Error("the shadow rule counted no shadow refusals")
	}
	if st.rules[0].eng.Counts.Get(engine.Reject, false) != 0 {
		t.Error("the shadow rule refused for real")
	}
	if h.upstream.Load() != 20 {
		t.Errorf("upstream saw %d of 20", h.upstream.Load())
	}
}

func TestTarpitLadder(t *testing.T) {
	h := newHarness(t, `tarpit: {max_delay: 2s, drip_interval: 100ms, ban_for: 1m}
rules:
  - name: t
    tarpit: true
    limits: [{requests: 10, per: 10s}]
`)
	var outcomes []string
	var upstreamAtDrip int64 = -1
	for i := 1; i <= 90; i++ {
		h.mu.Lock()
		h.slept = h.slept[:0]
		h.mu.Unlock()
		before := h.upstream.Load()
		w := h.req("203.0.113.5")
		o := "allow"
		switch {
		case w.Code == 200 && len(h.slept) > 0:
			o = "delay"
		case w.Code == 429:
			o = decodeProblem(t, w).Outcome
		}
		if o == "drip" {
			if h.upstream.Load() != before {
				upstreamAtDrip = h.upstream.Load()
			}
			if len(h.slept) < 2 {
				t.Errorf("request %d dripped with %d pauses", i, len(h.slept))
			}
		}
		if o == "ban" && w.Header().Get("Connection") != "close" {
			t.Error("a ban keeps the connection")
		}
		if len(outcomes) == 0 || outcomes[len(outcomes)-1] != o {
			outcomes = append(outcomes, o)
		}
	}
	if got := strings.Join(outcomes, ","); got != "allow,delay,drip,reject,ban" {
		t.Errorf("the ladder went %s", got)
	}
	if upstreamAtDrip >= 0 {
		t.Error("a dripped request reached the upstream")
	}
	// The ban outlives the estimate: a minute later the count has decayed
	// below the limit, but the key is still banned; after the ban it passes.
	h.clk.Advance(40 * time.Second)
	if w := h.req("203.0.113.5"); w.Code != 429 || decodeProblem(t, w).Outcome != "ban" {
		t.Errorf("during the ban: %d %s", w.Code, w.Body.String())
	}
	h.clk.Advance(2 * time.Minute)
	if w := h.req("203.0.113.5"); w.Code != 200 {
		t.Errorf("after the ban and the decay: %d %s", w.Code, w.Body.String())
	}
}

// At its caps the tarpit answers 429 at once: the held requests, and so the
// goroutines, never pass the cap.
func TestTarpitCapsBoundGoroutines(t *testing.T) {
	h := newHarness(t, `tarpit: {max_held: 20, max_held_per_key: 2, max_delay: 1m}
new_keys: {disabled: true} # 100 new keys at once would be a spike
rules:
  - name: t
    key: ["header:X-Key"]
    tarpit: true
    limits: [{requests: 10, per: 1m}]
`)
	const keys = 100
	// Bring every key just over its limit: the delay step.
	for k := range keys {
		for range 11 {
			h.req("198.51.100.1", "X-Key", fmt.Sprint("k", k))
		}
	}
	release := make(chan struct{})
	block := func(ctx context.Context, d time.Duration) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	h.sleep.Store(&block)
	base := runtime.NumGoroutine()
	var wg sync.WaitGroup
	var full, passed atomic.Int64
	for k := range keys {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := h.req("198.51.100.1", "X-Key", fmt.Sprint("k", k))
				switch {
				case w.Code == 429 && decodeProblem(t, w).Outcome == "tarpit_full":
					full.Add(1)
				case w.Code == 200:
					passed.Add(1)
				default:
					t.Errorf("unexpected %d for k%d: %s", w.Code, k, w.Body.String())
				}
			}()
		}
	}
	// Wait until every request is either held or answered. The two counts
	// are read apart, and a refused request adds itself to held for a moment
	// before it takes itself off (the check against the cap), so the sum
	// alone can reach 300 one refusal early: wait for both.
	deadline := time.Now().Add(10 * time.Second)
	for (h.mw.eng.Held() != 20 || full.Load() != keys*3-20) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	held := h.mw.eng.Held()
	gor := runtime.NumGoroutine() - base
	if held != 20 {
		t.Errorf("held %d, want the cap of 20", held)
	}
	if full.Load() != keys*3-20 {
		t.Errorf("%d immediate 429s, want %d", full.Load(), keys*3-20)
	}
	if gor > 20+5 {
		t.Errorf("%d goroutines above the baseline with 20 held", gor)
	}
	close(release)
	wg.Wait()
	if passed.Load() != 20 || h.mw.eng.Held() != 0 {
		t.Errorf("after release: %d passed, %d still held", passed.Load(), h.mw.eng.Held())
	}
	t.Logf("300 tarpitted requests: 20 held, %d goroutines above baseline, %d refused at once", gor, full.Load())
}

func TestBudgetAndReconcile(t *testing.T) {
	h := newHarness(t, `rules:
  - name: llm
    key: ["header:X-Key"]
    budget: {units: 1000, per: 1d, cost: 10, reconcile_header: X-Tokens-Used}
`)
	for i := range 4 {
		if w := h.req("198.51.100.1", "X-Key", "a", "X-Test-Tokens", "300"); w.Code != 200 {
			t.Fatalf("call %d: %d %s", i+1, w.Code, w.Body.String())
		}
	}
	// 4 x 300 = 1200 spent: the wallet is empty.
	w := h.req("198.51.100.1", "X-Key", "a", "X-Test-Tokens", "300")
	if w.Code != 429 {
		t.Fatalf("5th call: %d", w.Code)
	}
	p := decodeProblem(t, w)
	if p.Outcome != "over_budget" || p.Limit != "budget" || p.RetryAfter < 3600 {
		t.Errorf("problem %+v", p)
	}
	if w := h.req("198.51.100.1", "X-Key", "b", "X-Test-Tokens", "junk"); w.Code != 200 {
		t.Errorf("another key: %d", w.Code)
	}
	if h.mw.met.reconcileErrors.Load() != 1 || h.mw.met.reconciled.Load() != 4*290 {
		t.Errorf("reconciled %d, errors %d", h.mw.met.reconciled.Load(), h.mw.met.reconcileErrors.Load())
	}
}

// A wallet the sketch cannot track fails closed (503), unless fail_open.
func TestBudgetFailsClosed(t *testing.T) {
	for _, open := range []bool{false, true} {
		h := newHarness(t, fmt.Sprintf(`sketch: {buckets: 1}
rules:
  - name: llm
    key: ["header:X-Key"]
    budget: {units: 100000, per: 1d, cost: 1, fail_open: %v}
`, open))
		for k := range 8 { // eight heavy spenders fill the only bucket
			for range 20 {
				h.req("198.51.100.1", "X-Key", fmt.Sprint("whale", k), "X-Test-Tokens", "900")
			}
		}
		w := h.req("198.51.100.1", "X-Key", "newcomer")
		want := 503
		if open {
			want = 200
		}
		if w.Code != want {
			t.Errorf("fail_open %v: untracked wallet got %d, want %d: %s", open, w.Code, want, w.Body.String())
		}
		if !open && decodeProblem(t, w).Outcome != "budget_unknown" {
			t.Errorf("outcome %s", w.Body.String())
		}
	}
}

func TestMaxInFlight(t *testing.T) {
	h := newHarness(t, `rules:
  - name: stream
    key: ["header:X-Key"]
    max_in_flight: 1
`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		r := httptest.NewRequest("GET", "/stream", nil).WithContext(ctx)
		r.Header.Set("X-Key", "a")
		r.Header.Set("X-Test-Block", "1")
		w := httptest.NewRecorder()
		h.mw.ServeHTTP(w, r)
		done <- w.Code
	}()
	for h.upstream.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	if w := h.req("198.51.100.1", "X-Key", "a"); w.Code != 429 || decodeProblem(t, w).Outcome != "in_flight" {
		t.Errorf("a second stream for the key: %d %s", w.Code, w.Body.String())
	}
	if w := h.req("198.51.100.1", "X-Key", "b"); w.Code != 200 {
		t.Errorf("another key: %d", w.Code)
	}
	cancel()
	<-done
	if w := h.req("198.51.100.1", "X-Key", "a"); w.Code != 200 {
		t.Errorf("after the stream ended: %d", w.Code)
	}
}

// During a spike of new keys, keys first seen in it get a quarter of
// the limit; a key known from before keeps the whole limit.
func TestNewKeysDuringSpike(t *testing.T) {
	h := newHarness(t, `new_keys: {min_per_second: 20, spike_factor: 3, budget_factor: 0.25, window: 1m}
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{requests: 8, per: 1m}]
`)
	// Two calm minutes: 5 new keys a second, and a regular client at 6 a
	// minute (its estimate settles near 2 x 3 per 30 s tick).
	n := 0
	for s := range 120 {
		for range 5 {
			n++
			h.req("198.51.100.1", "X-Key", fmt.Sprint("calm", n))
		}
		if s%10 == 0 {
			if w := h.req("198.51.100.1", "X-Key", "regular"); w.Code != 200 {
				t.Fatalf("the regular client refused in the calm: %d", w.Code)
			}
		}
		h.clk.Advance(time.Second)
	}
	// A rotation flood: 200 new keys in one second.
	for i := range 200 {
		h.req("198.51.100.1", "X-Key", fmt.Sprint("rot", i))
	}
	if spike, _, _ := h.mw.eng.Spiking(h.mw.state.Load().set, h.clk.Now()); !spike {
		t.Fatal("200 new keys in a second after 5/s is not a spike")
	}
	passed := 0
	for range 8 {
		if w := h.req("198.51.100.1", "X-Key", "rot150"); w.Code == 200 {
			passed++
		}
	}
	if passed != 1 { // its first request was in the flood: 2 allowed in all
		t.Errorf("a key new in the spike got %d more requests, want 1 (a quarter of 8, less the first)", passed)
	}
	for i := range 2 {
		if w := h.req("198.51.100.1", "X-Key", "regular"); w.Code != 200 {
			t.Errorf("the known key's request %d refused during the spike", i+1)
		}
	}
}

func TestReloadKeepsCountsAndRejectsBadConfig(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: a\n    limits: [{name: rate, requests: 5, per: 10s}]\n")
	for range 4 {
		h.req("203.0.113.1")
	}
	// Same tick (5 s) and size: the sketch and its counts stay (counts are
	// kept by rule and limit name).
	cfg, err := ParseConfig("new.yaml", []byte("rules:\n  - name: a\n    limits: [{name: rate, requests: 10, per: 20s, burst: 5}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.mw.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	if w := h.req("203.0.113.1"); w.Code != 200 {
		t.Fatal("5th request refused")
	}
	if w := h.req("203.0.113.1"); w.Code != 429 {
		t.Fatal("the reload forgot the count: 6th request allowed")
	}
	bad := &Config{Rules: []Rule{{Name: "x"}}}
	if err := h.mw.Reload(bad); err == nil || !strings.Contains(err.Error(), "limits nothing") {
		t.Fatalf("bad reload: %v", err)
	}
	if w := h.req("203.0.113.1"); w.Code != 429 {
		t.Error("a failed reload changed the running config")
	}
	if h.mw.met.reloads[1].Load() != 1 || h.mw.state.Load().gen != 1 {
		t.Errorf("reload metrics: %d failed, generation %d", h.mw.met.reloads[1].Load(), h.mw.state.Load().gen)
	}
}

// tickOf is the tick a limit of requests per per compiles to.
func tickOf(t *testing.T, requests float64, per time.Duration) time.Duration {
	t.Helper()
	l, err := rate.Rate{Requests: requests, Per: per}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return l.Tick
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: api\n    limits: [{requests: 5, per: 10s}]\n")
	for range 20 {
		h.req("203.0.113.66")
	}
	h.req("203.0.113.67")
	fams := scrape(t, h.mw)
	for _, c := range []struct {
		name   string
		labels string
		want   float64
	}{
		{"sketchproxy_decisions_total", `outcome="allow",rule="api",shadow="false"`, 6},
		{"sketchproxy_decisions_total", `outcome="reject",rule="api",shadow="false"`, 15},
		{"sketchproxy_new_keys_total", ``, 2},
		{"sketchproxy_tarpit_held", ``, 0},
		{"sketchproxy_sketch_bytes", `buckets="65536",burst="4-7",tick="` + tickOf(t, 5, 10*time.Second).String() + `"`, 4194304},
		{"sketchproxy_top_offender_level", `key="` + h.mw.display("203.0.113.66") + `",rule="api"`, 1},
		{"sketchproxy_request_duration_seconds", `rule="api"`, 21}, // a histogram: its count
	} {
		if got, ok := metricValue(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "sketchproxy_sketch_evictions_total"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
}

// scrape reads /metrics with Prometheus's own text parser.
func scrape(t *testing.T, mw *Middleware) map[string]*dto.MetricFamily {
	t.Helper()
	w := httptest.NewRecorder()
	mw.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 {
		t.Fatalf("/metrics: %d %s", w.Code, w.Body.String())
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(w.Body.String()))
	if err != nil {
		t.Fatalf("the Prometheus parser rejects /metrics: %v\n%s", err, w.Body.String())
	}
	return fams
}

// metricValue is the value of the series name{labels} (labels sorted, as
// `a="x",b="y"`); a histogram's is its sample count.
func metricValue(fams map[string]*dto.MetricFamily, name, labels string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	for _, m := range f.Metric {
		var ls []string
		for _, l := range m.Label {
			ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		sort.Strings(ls)
		if strings.Join(ls, ",") != labels {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

// Malformed and odd requests get a clear result and are never dropped when
// they are within the limit.
func TestOddRequestsPass(t *testing.T) {
	h := newHarness(t, `client_ip: {trusted_proxies: ["10.0.0.0/8"]}
rules:
  - name: a
    match: {path_prefix: /}
    key: [ip, "header:X-Key", "query:token"]
    limits: [{requests: 100, per: 1s}]
`)
	for _, c := range []struct {
		name   string
		remote string
		target string
		hdr    []string
	}{
		{"garbage XFF from a trusted proxy", "10.0.0.1", "/", []string{"X-Forwarded-For", ",,, ,zz"}},
		{"garbage Forwarded", "10.0.0.1", "/", []string{"Forwarded", `for=";;;"`}},
		{"huge key header", "203.0.113.1", "/", []string{"X-Key", strings.Repeat("k", 60000)}},
		{"no key parts", "203.0.113.1", "/", nil},
		{"bad query escape", "203.0.113.1", "/?token=%zz&x=%", nil},
		{"host with port and IPv6 host", "203.0.113.1", "http://[::1]:8080/", nil},
		{"unicode path", "203.0.113.1", "/ünïcode/%F0%9F%98%80", nil},
	} {
		r := httptest.NewRequest("GET", "http://api.test/", nil)
		if strings.HasPrefix(c.target, "http") {
			r = httptest.NewRequest("GET", c.target, nil)
		} else {
			r.URL.RawQuery = strings.TrimPrefix(strings.SplitN(c.target+"?", "?", 2)[1], "?")
			r.URL.Path = strings.SplitN(c.target, "?", 2)[0]
		}
		r.RemoteAddr = c.remote + ":1"
		for i := 0; i+1 < len(c.hdr); i += 2 {
			r.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.mw.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Errorf("%s: %d %s", c.name, w.Code, w.Body.String())
		}
	}
}

// API keys never reach /metrics or the logs whole; closing twice is fine.
func TestSecretKeysAreRedacted(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: api\n    key: [\"header:X-API-Key\"]\n    limits: [{requests: 2, per: 10s}]\n")
	const secret = "sk-live-0123456789abcdef"
	for range 10 {
		h.req("203.0.113.1", "X-API-Key", secret)
	}
	w := httptest.NewRecorder()
	h.mw.MetricsHandler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(w.Body.String(), "sk-l") || !strings.Contains(w.Body.String(), `key="`+h.mw.display(secret)+`"`) {
		t.Errorf("top offenders show %q", regexpLine(w.Body.String(), "top_offender_level{"))
	}
	if err := h.mw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.mw.Close(); err != nil {
		t.Fatal(err)
	}
}

func regexpLine(body, substr string) string {
	for _, l := range strings.Split(body, "\n") {
		if strings.Contains(l, substr) {
			return l
		}
	}
	return ""
}

// sketchproxy_limit_refusals_total names the limit that refused, beside
// its rule.
func TestLimitRefusalsMetric(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: api\n    limits: [{requests: 3, per: 1s}, {name: hourly, requests: 5, per: 1h}]\n")
	for range 4 {
		h.req("203.0.113.70")
	}
	h.clk.Advance(3 * time.Second) // the per-second limit has room; the hourly has 2
	for range 4 {
		h.req("203.0.113.70")
	}
	fams := scrape(t, h.mw)
	for _, c := range []struct {
		labels string
		want   float64
	}{{`limit="per-1s",rule="api"`, 1}, {`limit="hourly",rule="api"`, 2}} {
		if got, ok := metricValue(fams, "sketchproxy_limit_refusals_total", c.labels); !ok || got != c.want {
			t.Errorf("sketchproxy_limit_refusals_total{%s} = %v (found %v), want %v", c.labels, got, ok, c.want)
		}
	}
}
