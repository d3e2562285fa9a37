package limit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
)

// A client sending 20 requests a second, twice its limit of 10, for a
// minute: it gets 10 at once (the default Burst), then exactly 10 a second.
func Example() {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0))
	l := limit.NewWith(limit.Config{Requests: 10, Per: time.Second, Clock: clk})
	defer l.Close()

	admitted := 0
	for range 60 * 20 {
		if l.Allow("192.0.2.1") {
			admitted++
		}
		clk.Advance(50 * time.Millisecond)
	}
	fmt.Println("admitted in 60 s:", admitted)
	// Output: admitted in 60 s: 607
}

// Decide answers with what the response headers need.
func ExampleLimiter_Decide() {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0))
	l := limit.NewWith(limit.Config{Requests: 1, Per: time.Minute, Clock: clk})
	defer l.Close()

	clk.Advance(20 * time.Second)
	for range 3 {
		d := l.Decide(time.Time{}, "api-key-1", 1)
		fmt.Printf("allowed %v, remaining %d, reset %v, retry after %v\n", d.Allowed, d.Remaining, d.Reset.Round(time.Second), d.RetryAfter.Round(time.Second))
	}
	// Output:
	// allowed true, remaining 0, reset 37s, retry after 0s
	// allowed false, remaining 0, reset 37s, retry after 37s
	// allowed false, remaining 0, reset 37s, retry after 37s
}

// Middleware limits each client address to 10 requests a second: here the
// 11th request at once is refused (the default Burst is 10).
func ExampleMiddleware() {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0)) // limit.New(10, time.Second) in production
	l := limit.NewWith(limit.Config{Requests: 10, Per: time.Second, Clock: clk})
	defer l.Close()
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	handler := limit.Middleware(l, limit.RemoteIP)(mux) // http.ListenAndServe(":8080", handler)

	var w *httptest.ResponseRecorder
	for range 11 {
		w = httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil) // from 192.0.2.1:1234
		handler.ServeHTTP(w, r)
	}
	for _, k := range []string{"Ratelimit-Policy", "Ratelimit", "Retry-After"} {
		fmt.Printf("%s: %s\n", k, w.Header().Get(k))
	}
	fmt.Println(w.Code)
	// Output:
	// Ratelimit-Policy: "default";q=10;w=1
	// Ratelimit: "default";r=0;t=1
	// Retry-After: 1
	// 429
}

// Behind a load balancer at 10.0.0.0/8, a limit per client address and
// one per API key, checked together; requests without a key are limited
// by address alone.
func ExampleMiddleware_severalLimits() {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0))
	perIP := limit.NewWith(limit.Config{Requests: 100, Per: time.Second, Name: "ip", Clock: clk})
	perKey := limit.NewWith(limit.Config{Requests: 1, Per: time.Minute, Name: "key", Clock: clk})
	defer perIP.Close()
	defer perKey.Close()
	client, err := limit.ClientIP(limit.TrustProxies("10.0.0.0/8"), limit.IPv6Prefix(64))
	if err != nil {
		panic(err)
	}
	key := func(r *http.Request) string { return r.Header.Get("X-Api-Key") }
	noKey := func(r *http.Request) bool { return key(r) == "" }
	handler := limit.Middleware(perIP, client)(
		limit.Middleware(perKey, key, limit.Skip(noKey))(http.NotFoundHandler()))

	for range 2 {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.1.2.3:4711"
		r.Header.Set("X-Forwarded-For", "198.51.100.7")
		r.Header.Set("X-Api-Key", "k1")
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Header().Get("RateLimit"))
	}
	// Output:
	// 404 "ip";r=99;t=1, "key";r=0;t=38
	// 429 "ip";r=99;t=1, "key";r=0;t=38
}
