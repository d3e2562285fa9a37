package caddyepochsketch

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
)

// doorAnswer is what a client learns from one decision, whatever the door:
// let through or not, Retry-After, and each RateLimit item's r and t.
type doorAnswer struct {
	allowed bool
	retry   string
	fields  string // ";r=R;t=T" per item, names dropped (each door names its policy)
}

var reItemValues = regexp.MustCompile(`;r=\d+;t=\d+`)

func doorAnswerOf(code int, h http.Header) doorAnswer {
	return doorAnswer{code == 200, h.Get("Retry-After"), strings.Join(reItemValues.FindAllString(h.Get("RateLimit"), -1), " ")}
}

// One timeline through the Caddy handler and package limit's Middleware,
// given the same words, gets the same decisions, Retry-After and RateLimit
// values, on one manual clock: a client at twice, then four times, its
// limit, then quiet, then at exactly its limit. sketchproxy/timeline_test.go's
// TestDoorsAgree holds SketchProxy's doors (the proxy, forward-auth and
// Envoy's service) to package limit on the same timelines, so all of them
// agree; this module does not link the proxy (its Envoy and JWT modules),
// so it is not run here.
func TestDoorsAgree(t *testing.T) {
	for _, c := range []struct {
		requests int
		per      string
	}{{5, "1s"}, {4, "1s"}, {7, "1s"}, {1, "1s"}, {100, "1m"}} {
		t.Run(fmt.Sprintf("%d-per-%s", c.requests, c.per), func(t *testing.T) {
			per, _ := time.ParseDuration(c.per)
			clk := epochsketch.NewManualClock(t0)
			ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})

			caddyDoor := newConfig(t, clk).provision(one("per-client", &Zone{Key: "{http.request.remote.host}", Events: float64(c.requests), Window: caddy.Duration(per)}))

			l := limit.NewWith(limit.Config{Requests: c.requests, Per: per, Clock: clk, Seed: 1, Name: "per-client-per-" + c.per})
			t.Cleanup(func() { l.Close() })
			lim := limit.Middleware(l, limit.RemoteIP)(ok)

			ask := func(h http.Handler, client string) doorAnswer {
				r := httptest.NewRequest("GET", "http://api.test/v1/x", nil)
				r.RemoteAddr = client + ":1234"
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				return doorAnswerOf(w.Code, w.Header())
			}
			gap := func(rate float64) time.Duration { return time.Duration(float64(per) / (rate * float64(c.requests))) }
			n, disagreements, refused := 0, 0, 0
			for _, p := range []struct {
				rate float64 // times the limit; 0: quiet
				for_ time.Duration
			}{{2, 10 * per}, {4, 10 * per}, {0, 5 * per}, {1, 10 * per}} {
				if p.rate == 0 {
					clk.Advance(p.for_)
					continue
				}
				for end := clk.Now().Add(p.for_); clk.Now().Before(end); clk.Advance(gap(p.rate)) {
					w := serve([]*Handler{caddyDoor}, prepared(func() *http.Request {
						r := httptest.NewRequest("GET", "http://api.test/v1/x", nil)
						r.RemoteAddr = "203.0.113.1:1234"
						return r
					}()))
					cd, lm := doorAnswerOf(w.Code, w.Header()), ask(lim, "203.0.113.3")
					n++
					if !cd.allowed {
						if !strings.Contains(w.Header().Get("RateLimit"), `"per-client-per-`) {
							t.Fatalf("a Caddy refusal without the RateLimit field: %v", w.Header())
						}
						refused++
					}
					if cd != lm {
						if disagreements++; disagreements <= 5 {
							t.Errorf("request %d at %v: caddy %+v, package limit %+v", n, clk.Now().Sub(t0), cd, lm)
						}
					}
				}
			}
			if refused == 0 {
				t.Fatalf("the Caddy door refused none of %d requests: the limit never ran", n)
			}
			if disagreements > 0 {
				t.Errorf("%d of %d decisions differ between the doors", disagreements, n)
			}
			t.Logf("%d requests, %d refused, both doors alike", n, refused)
		})
	}
}
