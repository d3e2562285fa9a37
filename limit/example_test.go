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
	// Output: admitted in 60 s: 605
}

// Decide answers with what the response headers need.
func ExampleLimiter_Decide() {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0))
	l := limit.NewWith(limit.Config{Requests: 1, Per: time.Minute, Clock: clk})
	defer l.Close()

	clk.Advance(20 * time.Second)
	for range 3 {
		d := l.Decide(time.Time{}, "api-key-1", 1)
		fmt.Printf("allowed %v, remaining %d, reset %v, retry after %v\n", d.Allowed, d.Remaining, d.Reset, d.RetryAfter)
	}
	// Output:
	// allowed true, remaining 0, reset 10s, retry after 0s
	// allowed false, remaining 0, reset 10s, retry after 40s
	// allowed false, remaining 0, reset 10s, retry after 40s
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
