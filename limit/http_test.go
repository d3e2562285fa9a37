package limit_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/limit"
)

// TestMiddleware: admitted requests reach the handler with RateLimit and
// RateLimit-Policy; a refused one gets 429, Retry-After and r=0 with the
// same wait as t, and never reaches the handler.
func TestMiddleware(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 2, Per: time.Second, Burst: 4, Name: "api"})
	clk.Advance(300 * time.Millisecond)
	served := 0
	h := limit.Middleware(l, limit.RemoteIP)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		io.WriteString(w, "ok")
	}))
	do := func(addr string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	// Burst 4: r counts down from q=2 (never above it) to 0; t is the
	// wait for one request more than r (1.34 s, a tick, while r is capped
	// at q and the next would need the count back to 1).
	for i, want := range []string{"r=2;t=2", "r=2;t=1", "r=1;t=1", "r=0;t=1"} {
		w := do("192.0.2.1:1000")
		if w.Code != 200 || served != i+1 {
			t.Fatalf("request %d: %d, served %d", i+1, w.Code, served)
		}
		checkHeaders(t, w, `"api";q=2;w=1`, `"api";`+want, "")
	}
	w := do("192.0.2.1:1001") // another port, the same client
	if w.Code != http.StatusTooManyRequests || served != 4 {
		t.Fatalf("5th request: %d, served %d; want 429 and not served", w.Code, served)
	}
	checkHeaders(t, w, `"api";q=2;w=1`, `"api";r=0;t=1`, "1")
	// Another client has its own limit.
	if w := do("[2001:db8::1]:443"); w.Code != 200 {
		t.Fatalf("another client: %d", w.Code)
	}
	// Two seconds on, the count has decayed to about 2 requests' worth:
	// room for 2 more after this one.
	clk.Advance(2 * time.Second)
	w = do("192.0.2.1:1002")
	if w.Code != 200 {
		t.Fatalf("two ticks later: %d", w.Code)
	}
	checkHeaders(t, w, `"api";q=2;w=1`, `"api";r=2;t=1`, "")

	// A 1-minute limit: Retry-After counts whole seconds until the count
	// leaves room: the start of the same step a tick (37.2 s) on.
	l2, clk2 := newManual(t, limit.Config{Requests: 1, Per: time.Minute})
	clk2.Advance(15500 * time.Millisecond)
	h = limit.Middleware(l2, limit.RemoteIP)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do("192.0.2.1:1")
	do("192.0.2.1:1")
	w = do("192.0.2.1:1")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("3rd request on 1 per minute: %d", w.Code)
	}
	checkHeaders(t, w, `"default";q=1;w=60`, `"default";r=0;t=37`, "37")
}

func checkHeaders(t *testing.T, w *httptest.ResponseRecorder, policy, rl, retry string) {
	t.Helper()
	h := w.Result().Header
	if got := h.Get("RateLimit-Policy"); got != policy {
		t.Errorf("RateLimit-Policy %q, want %q", got, policy)
	}
	if got := h.Get("RateLimit"); got != rl {
		t.Errorf("RateLimit %q, want %q", got, rl)
	}
	if got := h.Get("Retry-After"); got != retry {
		t.Errorf("Retry-After %q, want %q", got, retry)
	}
}

// TestMiddlewareServer: through a real server on a free port, a client's
// third request of a burst of 2 is refused with 429.
func TestMiddlewareServer(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour, Burst: 2})
	srv := httptest.NewServer(limit.Middleware(l, limit.RemoteIP)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	for i, want := range []int{200, 200, 429} {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || resp.Header.Get("RateLimit-Policy") != `"default";q=1;w=3600` {
			t.Fatalf("request %d: %d %q, want %d", i+1, resp.StatusCode, resp.Header.Get("RateLimit-Policy"), want)
		}
	}
}

// TestPolicy: the limit in whole requests per whole seconds.
func TestPolicy(t *testing.T) {
	for _, tc := range []struct {
		requests int
		per      time.Duration
		want     string
	}{
		{10, time.Second, `"default";q=10;w=1`},
		{2, 500 * time.Millisecond, `"default";q=4;w=1`},
		{3, 1500 * time.Millisecond, `"default";q=6;w=3`},
		{100, time.Minute, `"default";q=100;w=60`},
		{7, time.Second + time.Nanosecond, `"default";q=13;w=2`}, // no m up to 1000: rounded down
	} {
		l := limit.NewWith(limit.Config{Requests: tc.requests, Per: tc.per, Burst: 2 * tc.requests, Seed: 1})
		defer l.Close()
		r := httptest.NewRequest("GET", "/", nil)
		w := httptest.NewRecorder()
		limit.Middleware(l, limit.RemoteIP)(http.NotFoundHandler()).ServeHTTP(w, r)
		if got := w.Result().Header.Get("RateLimit-Policy"); got != tc.want {
			t.Errorf("%d per %v: %q, want %q", tc.requests, tc.per, got, tc.want)
		}
	}
}

func TestRemoteIP(t *testing.T) {
	for addr, want := range map[string]string{
		"192.0.2.1:1234":      "192.0.2.1",
		"[2001:db8::1]:443":   "2001:db8::1",
		"[fe80::1%eth0]:8080": "fe80::1%eth0",
		"192.0.2.1":           "192.0.2.1", // no port: as it is
		"@":                   "@",         // a Unix socket's peer
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		if got := limit.RemoteIP(r); got != want {
			t.Errorf("RemoteIP(%q) = %q, want %q", addr, got, want)
		}
	}
}
