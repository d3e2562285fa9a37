package sketchproxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

// answer is what a client learns from one decision, whatever the door:
// let through or not, Retry-After, each RateLimit item's r and t, and each
// RateLimit-Policy item's q and w.
type answer struct {
	allowed bool
	retry   string
	fields  string // ";r=R;t=T" per item, names dropped (each door names its policy)
	policy  string // ";q=Q;w=W" per item, names dropped
}

var (
	reItemValues   = regexp.MustCompile(`;r=\d+;t=\d+`)
	rePolicyValues = regexp.MustCompile(`;q=\d+;w=\d+`)
)

func answerOf(allowed bool, retry, rateLimit, policy string) answer {
	return answer{allowed, retry, strings.Join(reItemValues.FindAllString(rateLimit, -1), " "), strings.Join(rePolicyValues.FindAllString(policy, -1), " ")}
}

// doorsHarness drives one Middleware through its three doors: the proxy
// (ServeHTTP), the forward-auth check, and Envoy's rate-limit service,
// each with clients of its own, under one rule of requests per per; and
// package limit's Middleware with the same words, on the same clock.
type doorsHarness struct {
	*harness
	rls *rls.Service
	lim http.Handler
}

func newDoorsHarness(t *testing.T, requests int, per string, extra ...string) *doorsHarness {
	unit := map[string]string{"1s": "second", "1m": "minute"}[per]
	h := newHarness(t, strings.Join(extra, "")+fmt.Sprintf(`client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {gateway: caddy}
envoy_rls:
  listen: 127.0.0.1:0
  response_headers: draft
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: %s, requests_per_unit: %d}
rules:
  - name: per-client
    limits: [{requests: %d, per: %s}]
`, unit, requests, requests, per))
	p, _ := time.ParseDuration(per)
	l := limit.NewWith(limit.Config{Requests: requests, Per: p, Clock: h.clk, Seed: 1, Name: "per-client-per-" + per})
	t.Cleanup(func() { l.Close() })
	lim := limit.Middleware(l, limit.RemoteIP)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return &doorsHarness{harness: h, rls: h.mw.rlsService(), lim: lim}
}

// limit is one request through package limit's Middleware.
func (d *doorsHarness) limit(client string) answer {
	r := httptest.NewRequest("GET", "http://api.test/v1/x", nil)
	r.RemoteAddr = client + ":1234"
	w := httptest.NewRecorder()
	d.lim.ServeHTTP(w, r)
	return answerOf(w.Code == 200, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"), w.Header().Get("RateLimit-Policy"))
}

func (d *doorsHarness) proxy(client string) answer {
	w := d.req(client)
	return answerOf(w.Code == 200, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"), w.Header().Get("RateLimit-Policy"))
}

func (d *doorsHarness) check(client string) answer {
	r := httptest.NewRequest("GET", "http://api.test/check", nil)
	r.RemoteAddr = "127.0.0.1:5555"
	r.Header.Set("X-Forwarded-For", client)
	r.Header.Set("X-Forwarded-Method", "GET")
	r.Header.Set("X-Forwarded-Uri", "/v1/x")
	w := d.do(r)
	return answerOf(w.Code == 200, w.Header().Get("Retry-After"), w.Header().Get("RateLimit"), w.Header().Get("RateLimit-Policy"))
}

func (d *doorsHarness) envoy(t *testing.T, client string) answer {
	resp, err := d.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: client}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{}
	for _, h := range resp.ResponseHeadersToAdd {
		hdr.Add(h.Key, h.Value)
	}
	// The descriptor's own status says what the field says.
	st := resp.GetStatuses()[0]
	want := fmt.Sprintf(";r=%d;t=%d", st.GetLimitRemaining(), rate.Seconds(st.GetDurationUntilReset().AsDuration()))
	if got := reItemValues.FindString(hdr.Get("RateLimit")); got != want {
		t.Errorf("Envoy's status says %s, its RateLimit field %s", want, got)
	}
	return answerOf(resp.OverallCode == rlsv3.RateLimitResponse_OK, hdr.Get("Retry-After"), hdr.Get("RateLimit"), hdr.Get("RateLimit-Policy"))
}

// One timeline through every door gets the same decisions, Retry-After and
// RateLimit values: a client at twice, then four times, its limit, then
// quiet, then at exactly its limit, on a manual clock. Package limit's
// Middleware, given the same words, answers the same too: package rate
// compiles both.
func TestDoorsAgree(t *testing.T) {
	for _, c := range []struct {
		requests int
		per      string
	}{{5, "1s"}, {4, "1s"}, {7, "1s"}, {1, "1s"}, {100, "1m"}} {
		t.Run(fmt.Sprintf("%d-per-%s", c.requests, c.per), func(t *testing.T) {
			d := newDoorsHarness(t, c.requests, c.per)
			per, _ := time.ParseDuration(c.per)
			gap := func(rate float64) time.Duration { return time.Duration(float64(per) / (rate * float64(c.requests))) }
			type phase struct {
				rate float64 // times the limit; 0: quiet
				for_ time.Duration
			}
			n, disagreements, refused := 0, 0, 0
			for _, p := range []phase{{2, 10 * per}, {4, 10 * per}, {0, 5 * per}, {1, 10 * per}} {
				if p.rate == 0 {
					d.clk.Advance(p.for_)
					continue
				}
				for end := d.clk.Now().Add(p.for_); d.clk.Now().Before(end); d.clk.Advance(gap(p.rate)) {
					a, b, e, l := d.proxy("203.0.113.1"), d.check("203.0.113.2"), d.envoy(t, "203.0.113.3"), d.limit("203.0.113.4")
					n++
					if !a.allowed {
						refused++
					}
					if a != b || a != e || a != l {
						if disagreements++; disagreements <= 5 {
							t.Errorf("request %d at %v: proxy %+v, check %+v, envoy %+v, package limit %+v", n, d.clk.Now().Sub(t0), a, b, e, l)
						}
					}
				}
			}
			if refused == 0 {
				t.Fatalf("no door refused any of %d requests: the limits never ran", n)
			}
			if disagreements > 0 {
				t.Errorf("%d of %d decisions differ between the doors", disagreements, n)
			}
		})
	}
}

// A client at any overload is admitted at its limit, exactly for odd limits
// too (to 1% over a minute past the first burst), and a client at its limit
// is never refused: through the proxy door, on a manual clock.
func TestSteadyOverloadIsExact(t *testing.T) {
	for _, c := range []struct {
		requests int
		per      time.Duration
	}{{1, time.Second}, {3, time.Second}, {5, time.Second}, {7, time.Second}, {10, time.Second}, {100, time.Minute}, {25, time.Minute}} {
		for _, over := range []float64{1, 2, 4} {
			t.Run(fmt.Sprintf("%d-per-%v-at-%gx", c.requests, c.per, over), func(t *testing.T) {
				h := newHarness(t, fmt.Sprintf("rules:\n  - limits: [{requests: %d, per: %v}]\n", c.requests, c.per))
				gap := time.Duration(float64(c.per) / (over * float64(c.requests)))
				// Past the first burst: a minute's worth of periods, measured
				// after one period of warming up.
				warm := h.clk.Now().Add(c.per)
				end := warm.Add(60 * c.per)
				admitted, refused := 0, 0
				for ; h.clk.Now().Before(end); h.clk.Advance(gap) {
					ok := h.req("203.0.113.1").Code == 200
					if h.clk.Now().Before(warm) {
						continue
					}
					if ok {
						admitted++
					} else {
						refused++
					}
				}
				want := 60 * c.requests
				if over == 1 && refused > 0 {
					t.Errorf("a client at its limit was refused %d times", refused)
				}
				// At most package rate's Excess over the limit (about 2%).
				if d := float64(admitted-want) / float64(want); d > rate.Excess(uint32(c.requests))+0.01 || d < -0.01 {
					t.Errorf("admitted %d over 60 periods, want %d (%+.1f%%)", admitted, want, 100*d)
				}
			})
		}
	}
}

// Key rotation meets the same defence through every door: during a spike
// of new keys, each new key gets the new keys' share of the limit, through
// the proxy as through Envoy's rate-limit service (the same engine call).
func TestDoorsShareTheNewKeyDefence(t *testing.T) {
	// 300 new addresses, 8 requests each, over 3 seconds.
	rotate := func(ask func(client string) bool, clk *epochsketch.ManualClock) (admitted int) {
		for i := range 300 {
			client := fmt.Sprintf("10.1.%d.%d", i/250, i%250+1)
			for range 8 {
				if ask(client) {
					admitted++
				}
				clk.Advance(3 * time.Second / 2400)
			}
		}
		return admitted
	}
	const spiky = "new_keys: {warmup: 0s, min_per_second: 5}\n"
	hp := newDoorsHarness(t, 8, "1m", spiky)
	proxy := rotate(func(c string) bool { return hp.proxy(c).allowed }, hp.clk)
	he := newDoorsHarness(t, 8, "1m", spiky)
	envoy := rotate(func(c string) bool { return he.envoy(t, c).allowed }, he.clk)
	if proxy != envoy || proxy > 2400/2 {
		t.Errorf("300 rotating keys x 8 requests: the proxy admitted %d, Envoy's service %d; want the same, and well under the 2400 sent", proxy, envoy)
	}
	t.Logf("admitted of 2400: proxy %d, Envoy %d", proxy, envoy)
}
