package limit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/limit"
)

// serve runs h on one request from addr with the given header lines.
func serve(h http.Handler, addr string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = addr
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func apiKey(r *http.Request) string { return r.Header.Get("X-Api-Key") }

// remaining is the requests key may still send on l, read without counting.
func remaining(l *limit.Limiter, key string) int { return l.Decide(time.Time{}, key, 0).Remaining }

// TestMiddlewareSeveralLimits: two limits on one route, by Also or by one
// Middleware directly around another's handler, list both policies in one
// RateLimit-Policy and one RateLimit field, and a request the inner limit
// refuses is not counted by the outer one.
func TestMiddlewareSeveralLimits(t *testing.T) {
	for _, form := range []string{"nested", "also"} {
		t.Run(form, func(t *testing.T) {
			perIP, _ := newManual(t, limit.Config{Requests: 10, Per: time.Second, Name: "ip"})
			perKey, clk := newManual(t, limit.Config{Requests: 2, Per: time.Minute, Name: "key"})
			clk.Advance(15 * time.Second)
			served := 0
			final := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
			var h http.Handler
			if form == "nested" {
				h = limit.Middleware(perIP, limit.RemoteIP)(limit.Middleware(perKey, apiKey)(final))
			} else {
				h = limit.Middleware(perIP, limit.RemoteIP, limit.Also(perKey, apiKey))(final)
			}
			for i, want := range []int{200, 200, 429, 429, 429} {
				w := serve(h, "192.0.2.1:1", "X-Api-Key", "k1")
				if w.Code != want {
					t.Fatalf("request %d: %d, want %d", i+1, w.Code, want)
				}
				pol, rl := w.Header().Values("RateLimit-Policy"), w.Header().Values("RateLimit")
				if len(pol) != 1 || pol[0] != `"ip";q=10;w=1, "key";q=2;w=60` {
					t.Fatalf("request %d: RateLimit-Policy %q, want one field with both policies, outer first", i+1, pol)
				}
				if want == 429 {
					// 2 per minute, burst 2 (a tick of 39.7 s): 4 counts of
					// the 5 the limit holds decay to 3, room for one, 16 s
					// from now.
					if len(rl) != 1 || rl[0] != `"ip";r=8;t=1, "key";r=0;t=16` || w.Header().Get("Retry-After") != "16" {
						t.Fatalf("request %d: RateLimit %q, Retry-After %q", i+1, rl, w.Header().Get("Retry-After"))
					}
				}
			}
			if served != 2 {
				t.Fatalf("served %d, want 2", served)
			}
			if r := remaining(perIP, "192.0.2.1"); r != 8 {
				t.Fatalf("the per-address limit has %d left, want 8: it counted requests the per-key limit refused", r)
			}
			// The outer limit refusing: the inner does not count either.
			for range 8 {
				serve(h, "192.0.2.1:1", "X-Api-Key", fmt.Sprint("other-", served))
			}
			if w := serve(h, "192.0.2.1:1", "X-Api-Key", "fresh"); w.Code != 429 || remaining(perKey, "fresh") != 2 {
				t.Fatalf("outer limit spent: %d, and the per-key limit of a fresh key has %d left, want 429 and 2", w.Code, remaining(perKey, "fresh"))
			}
		})
	}
}

// TestMiddlewareSameLimitTwice: one Limiter given twice for a request's
// key (by Also, or a Middleware nested in another of the same limit) is
// one limit: a limit of 1 admits the first request, counts it once, and
// lists one item. Given twice with different keys, it is two.
func TestMiddlewareSameLimitTwice(t *testing.T) {
	for _, form := range []string{"nested", "also"} {
		t.Run(form, func(t *testing.T) {
			l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour})
			final := http.NotFoundHandler()
			var h http.Handler
			if form == "nested" {
				h = limit.Middleware(l, apiKey)(limit.Middleware(l, apiKey)(final))
			} else {
				h = limit.Middleware(l, apiKey, limit.Also(l, apiKey))(final)
			}
			w := serve(h, "192.0.2.1:1", "X-Api-Key", "k")
			if w.Code != 404 || w.Header().Get("RateLimit") != `"default";r=0;t=2196` {
				t.Fatalf("first request: %d, RateLimit %q: want the handler's 404 and one item", w.Code, w.Header().Get("RateLimit"))
			}
			if w := serve(h, "192.0.2.1:1", "X-Api-Key", "k"); w.Code != 429 {
				t.Fatalf("second request: %d, want 429", w.Code)
			}
			if r := remaining(l, "k"); r != 0 {
				t.Fatalf("%d left", r)
			}
		})
	}
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour})
	h := limit.Middleware(l, apiKey, limit.Also(l, limit.RemoteIP))(http.NotFoundHandler())
	if w := serve(h, "192.0.2.1:1", "X-Api-Key", "k"); w.Code != 404 || remaining(l, "k") != 0 || remaining(l, "192.0.2.1") != 0 {
		t.Fatalf("two keys of one Limiter: %d, each should count once", w.Code)
	}
}

// TestMiddlewareApart: Middlewares with another handler between them
// append their items to one field, though each counts on its own.
func TestMiddlewareApart(t *testing.T) {
	a, _ := newManual(t, limit.Config{Requests: 10, Per: time.Second, Name: "a"})
	b, _ := newManual(t, limit.Config{Requests: 5, Per: time.Second, Name: "b"})
	inner := limit.Middleware(b, limit.RemoteIP)(http.NotFoundHandler())
	between := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { inner.ServeHTTP(w, r) })
	w := serve(limit.Middleware(a, limit.RemoteIP)(between), "192.0.2.1:1")
	if got := w.Header().Values("RateLimit"); len(got) != 1 || got[0] != `"a";r=9;t=1, "b";r=4;t=1` {
		t.Fatalf("RateLimit %q, want both items in one field", got)
	}
}

// TestMiddlewareSkip: a skipped request reaches the handler uncounted and
// without fields; the others are limited.
func TestMiddlewareSkip(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour})
	h := limit.Middleware(l, apiKey, limit.Skip(func(r *http.Request) bool { return apiKey(r) == "" }))(http.NotFoundHandler())
	for range 3 {
		if w := serve(h, "192.0.2.1:1"); w.Code != 404 || w.Header().Get("RateLimit") != "" {
			t.Fatalf("a request without a key: %d %q, want the handler's 404 and no fields", w.Code, w.Header().Get("RateLimit"))
		}
	}
	if r := remaining(l, ""); r != 1 {
		t.Fatalf("the key \"\" has %d left, want 1: skipped requests were counted", r)
	}
	serve(h, "192.0.2.1:1", "X-Api-Key", "k")
	if w := serve(h, "192.0.2.1:1", "X-Api-Key", "k"); w.Code != 429 {
		t.Fatalf("a keyed request over the limit: %d", w.Code)
	}
}

// TestMiddlewareOnRefused: a refusal handler answers instead of the 429,
// with the fields set and the refusing Decision.
func TestMiddlewareOnRefused(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 1, Per: time.Minute})
	clk.Advance(20 * time.Second)
	var got limit.Decision
	h := limit.Middleware(l, limit.RemoteIP, limit.OnRefused(func(w http.ResponseWriter, r *http.Request, d limit.Decision) {
		got = d
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"error":"slow down"}`)
	}))(http.NotFoundHandler())
	serve(h, "192.0.2.1:1")
	w := serve(h, "192.0.2.1:1")
	// 1 per minute: a tick of 37.2 s, from the start of the step the
	// first request was counted in (at most 1.2 s before it).
	if w.Code != 503 || w.Body.String() != `{"error":"slow down"}` || w.Header().Get("Retry-After") != "38" || w.Header().Get("RateLimit") != `"default";r=0;t=38` {
		t.Fatalf("%d %q %v", w.Code, w.Body.String(), w.Header())
	}
	if got.Allowed || got.RetryAfter <= 37*time.Second || got.RetryAfter > 37200*time.Millisecond {
		t.Fatalf("the handler got %+v, want the refusal with its 37 to 37.2 s wait", got)
	}
}

// TestMiddlewareLegacyHeaders: X-RateLimit-Limit, -Remaining and -Reset
// (Unix seconds) beside the draft's fields.
func TestMiddlewareLegacyHeaders(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 2, Per: time.Minute})
	clk.Advance(20 * time.Second)
	h := limit.Middleware(l, limit.RemoteIP, limit.LegacyHeaders())(http.NotFoundHandler())
	check := func(w *httptest.ResponseRecorder, lim, rem string, reset int64) {
		t.Helper()
		got := []string{w.Header().Get("X-RateLimit-Limit"), w.Header().Get("X-RateLimit-Remaining"), w.Header().Get("X-RateLimit-Reset")}
		if want := []string{lim, rem, fmt.Sprint(reset)}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("X-RateLimit-Limit, -Remaining, -Reset: %q, want %q", got, want)
		}
	}
	// Reset is when one request more than Remaining fits (a tick of
	// 39.7 s): after the first, both (its 2 counts decayed to 1: a tick
	// on); after the second, one (4 counts to 3: 16.5 s on); refused, the
	// same.
	check(serve(h, "192.0.2.1:1"), "2", "1", t0.Unix()+20+40)
	check(serve(h, "192.0.2.1:1"), "2", "0", t0.Unix()+20+17)
	check(serve(h, "192.0.2.1:1"), "2", "0", t0.Unix()+20+17)
}

// TestAddFields: a handler of its own writes the fields of several
// Decisions: one field each, the longest Retry-After.
func TestAddFields(t *testing.T) {
	a, _ := newManual(t, limit.Config{Requests: 1, Per: time.Second, Name: "a"})
	b, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour, Name: "b"})
	a.Decide(time.Time{}, "k", 1)
	b.Decide(time.Time{}, "k", 1)
	h := http.Header{}
	a.AddFields(h, a.Decide(time.Time{}, "k", 1))
	b.AddFields(h, b.Decide(time.Time{}, "k", 1))
	if got := []string{h.Get("RateLimit-Policy"), h.Get("RateLimit"), h.Get("Retry-After")}; strings.Join(got, "|") != `"a";q=1;w=1, "b";q=1;w=3600|"a";r=0;t=1, "b";r=0;t=2196|2196` {
		t.Fatalf("%q", got)
	}
}

// TestMiddlewarePanics: a nil Limiter or key function is a programming
// error, reported when the Middleware is built.
func TestMiddlewarePanics(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Second})
	for name, f := range map[string]func(){
		"nil key":     func() { limit.Middleware(l, nil) },
		"nil limiter": func() { limit.Middleware(nil, limit.RemoteIP) },
		"nil Also":    func() { limit.Also(nil, limit.RemoteIP) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "nil") {
					t.Errorf("%s: recovered %v, want a panic saying what is nil", name, r)
				}
			}()
			f()
		}()
	}
}

// TestClientIP: the options pick the one header read (X-Forwarded-For, or
// Forwarded alone), the trusted peers (a Unix socket's with "unix") and
// the grouping. How a header is walked is package clientip's, tested
// there.
func TestClientIP(t *testing.T) {
	xff, err := limit.ClientIP(limit.TrustProxies("10.0.0.0/8", "192.0.2.7", "::1"))
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := limit.ClientIP(limit.TrustProxies("10.0.0.0/8"), limit.FromForwarded(), limit.IPv6Prefix(64))
	if err != nil {
		t.Fatal(err)
	}
	unix, err := limit.ClientIP(limit.TrustProxies("unix", "10.0.0.0/8"))
	if err != nil {
		t.Fatal(err)
	}
	v6, err := limit.ClientIP(limit.IPv6Prefix(64))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  func(*http.Request) string
		peer string
		hdr  []string
		want string
	}{
		{"untrusted peer: its header ignored", xff, "203.0.113.9:1", []string{"X-Forwarded-For", "198.51.100.1"}, "203.0.113.9"},
		{"one trusted proxy", xff, "10.1.2.3:1", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"no header from a proxy", xff, "10.1.2.3:1", nil, "10.1.2.3"},
		{"Forwarded is not read", xff, "10.1.2.3:1", []string{"Forwarded", "for=6.6.6.6"}, "10.1.2.3"},
		{"Forwarded, IPv6 by /64", fwd, "10.1.2.3:1", []string{"Forwarded", `for=6.6.6.6, for="[2001:db8:1:2:3::9]:4711";proto=https`}, "2001:db8:1:2::/64"},
		{"X-Forwarded-For is not read", fwd, "10.1.2.3:1", []string{"X-Forwarded-For", "6.6.6.6"}, "10.1.2.3"},
		{"a Unix socket peer, trusted", unix, "@", []string{"X-Forwarded-For", "198.51.100.1"}, "198.51.100.1"},
		{"a Unix socket peer, no header", unix, "@", nil, "@"},
		{"a Unix socket peer, a hop that does not parse", unix, "@", []string{"X-Forwarded-For", "unknown"}, "@"},
		{"a Unix socket peer, untrusted", xff, "@", []string{"X-Forwarded-For", "198.51.100.1"}, "@"},
		{"direct, IPv6 by /64", v6, "[2001:db8::1]:443", nil, "2001:db8::/64"},
		{"direct, IPv4 whole", v6, "192.0.2.1:443", nil, "192.0.2.1"},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = tc.peer
		for i := 0; i+1 < len(tc.hdr); i += 2 {
			r.Header.Add(tc.hdr[i], tc.hdr[i+1])
		}
		if got := tc.key(r); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestClientIPErrors: an option ClientIP cannot use is an error naming it.
func TestClientIPErrors(t *testing.T) {
	for _, tc := range []struct {
		opt  limit.IPOption
		want string
	}{
		{limit.TrustProxies("10.0.0.0/33"), `TrustProxies: "10.0.0.0/33" is not an IP address, a CIDR prefix or "unix"`},
		{limit.TrustProxies("proxy.example"), `TrustProxies: "proxy.example"`},
		{limit.IPv6Prefix(0), "IPv6Prefix(0): want 1 to 128"},
		{limit.IPv6Prefix(129), "IPv6Prefix(129)"},
	} {
		if _, err := limit.ClientIP(tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "limit: ") {
			t.Errorf("%v, want an error with %q", err, tc.want)
		}
	}
}

// TestRemoteIPUnixSocket: through a real server on a Unix socket, every
// client has the address "@", so all share one key.
func TestRemoteIPUnixSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Skip("no Unix sockets here:", err)
	}
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour})
	var keys []string
	var mu sync.Mutex
	srv := &http.Server{Handler: limit.Middleware(l, func(r *http.Request) string {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, limit.RemoteIP(r))
		return limit.RemoteIP(r)
	})(http.NotFoundHandler())}
	go srv.Serve(ln)
	defer srv.Close()
	var codes []int
	for range 2 {
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}}
		resp, err := c.Get("http://unix/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		c.CloseIdleConnections()
	}
	if fmt.Sprint(codes) != "[404 429]" || fmt.Sprint(keys) != "[@ @]" {
		t.Fatalf("two clients on one socket: %v, keys %q; want [404 429] and one key", codes, keys)
	}
}

// TestWait: Wait sleeps what Decide's RetryAfter says and is then
// admitted. The next Wait, the key now at its limit, first waits out the
// pacing (Per/Requests: 30 s), and when another caller takes the room in
// the meantime, waits what RetryAfter says again. On a ManualClock that
// the test's sleep moves, never the wall clock.
func TestWait(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 2, Per: time.Minute})
	clk.Advance(20 * time.Second)
	var slept []time.Duration
	limit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		clk.Advance(d)
		return nil
	})
	ctx := context.Background()
	for range 2 {
		if err := l.Wait(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	want := l.Decide(time.Time{}, "k", 1).RetryAfter // until the count leaves room
	if err := l.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(slept) != fmt.Sprint([]time.Duration{want}) || want <= 0 || want > 40*time.Second {
		t.Fatalf("slept %v, want one wait of Retry-After's %v (under a tick, 39.7 s)", slept, want)
	}
	if r := remaining(l, "k"); r != 0 {
		t.Fatalf("%d left after the wait, want 0: the waited request was counted", r)
	}
	// The pacing, then another caller takes the room first: Wait waits
	// again.
	slept = nil
	limit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		clk.Advance(d)
		if len(slept) == 1 {
			l.Allow("k") // the racer
		}
		return nil
	})
	if err := l.Wait(ctx, "k"); err != nil || len(slept) != 2 || slept[0] != 30*time.Second || slept[1] <= 0 || slept[1] > 40*time.Second {
		t.Fatalf("%v, slept %v: want the pacing's 30s, then the Retry-After the racer left, under a tick", err, slept)
	}
}

// TestWaitEnds: a cancelled context, a deadline before the wait ends, and
// more requests than the Burst end Wait with an error, and count nothing.
func TestWaitEnds(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 1, Per: 24 * time.Hour})
	l.Allow("k")
	ctx, cancel := context.WithCancel(context.Background())
	limit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		cancel()
		<-ctx.Done()
		return ctx.Err()
	})
	if err := l.Wait(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	limit.SetSleep(l, func(context.Context, time.Duration) error {
		t.Fatal("slept past the deadline")
		return nil
	})
	dctx, dcancel := context.WithTimeout(context.Background(), time.Hour) // the wait is 12 h or more
	defer dcancel()
	if err := l.Wait(dctx, "k"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "beyond the context's deadline") {
		t.Fatalf("a deadline before the wait ends: %v", err)
	}
	if err := l.WaitN(context.Background(), "k", 2); err == nil || !strings.Contains(err.Error(), "more requests than the Burst of 1") {
		t.Fatalf("WaitN above the Burst: %v", err)
	}
	if err := l.WaitN(context.Background(), "other", 0); err != nil || remaining(l, "other") != 1 {
		t.Fatalf("WaitN(0): %v", err)
	}
	if r := remaining(l, "k"); r != 0 {
		t.Fatalf("%d left", r)
	}
}

// TestReset: a reset key gets its Burst again; other keys keep their
// counts. Racing with Allow (run under -race), 50 resets give at most 50
// more Bursts.
func TestReset(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 3, Per: time.Hour, NumBuckets: 1})
	for range 3 {
		l.Allow("a")
		l.Allow("b")
	}
	if l.Allow("a") {
		t.Fatal("over the limit before Reset")
	}
	l.Reset("a")
	l.Reset("never-seen")
	for i := range 3 {
		if !l.Allow("a") {
			t.Fatalf("request %d after Reset refused", i+1)
		}
	}
	if l.Allow("a") || l.Allow("b") {
		t.Fatal("Reset gave more than the Burst, or reset another key")
	}
	l.Reset("a")
	var wg sync.WaitGroup
	var admitted [4]int
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if g == 0 {
					if i < 50 {
						l.Reset("a")
					}
				} else if l.Allow("a") {
					admitted[g]++
				}
			}
		}()
	}
	wg.Wait()
	if n := admitted[1] + admitted[2] + admitted[3]; n < 3 || n > 3*51 {
		t.Fatalf("admitted %d with 50 racing resets, want 3 to %d", n, 3*51)
	}
}

// TestWaitBeyondDurations: a wait longer than a time.Duration holds (3
// per 292 years: its whole burst again is 3 ticks of 146 years away) is
// the longest Duration, so that Retry-After says 292 years, not 1 s, and
// Wait reports the deadline at once rather than spinning on a negative
// wait until the context ends.
func TestWaitBeyondDurations(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 3, Per: 292 * 365 * 24 * time.Hour})
	l.AllowN(time.Time{}, "k", 3)
	d := l.Decide(time.Time{}, "k", 3)
	if d.Allowed || d.RetryAfter != math.MaxInt64 {
		t.Fatalf("the whole burst again: %+v, want a refusal for the longest Duration", d)
	}
	h := http.Header{}
	l.AddFields(h, d)
	if got := h.Get("Retry-After"); got != "9223372037" {
		t.Fatalf("Retry-After %q, want 9223372037 (292 years)", got)
	}
	limit.SetSleep(l, func(context.Context, time.Duration) error {
		t.Fatal("slept past the deadline")
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if err := l.WaitN(ctx, "k", 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitN: %v, want the deadline at once", err)
	}
}
