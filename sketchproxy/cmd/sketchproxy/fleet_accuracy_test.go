package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/epochsketch/epochsketch/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// aloneReplica is what one replica alone admits: package rate's arithmetic
// (2 counts a request, threshold 2 × Burst, a count that halves every
// tick on the Unix epoch) on an exact count per key, decided at the
// client's send time. It is the engine's own (a sketch with few keys holds
// each exactly), without the network.
type aloneReplica struct {
	mu  sync.Mutex
	lim rate.Limit
	m   map[string][2]int64 // count, tick
}

func newAloneReplica(t *testing.T, r rate.Rate) *aloneReplica {
	lim, err := r.CompileHalving() // as a fleet counts (docs/fleets.md)
	if err != nil {
		t.Fatal(err)
	}
	return &aloneReplica{lim: lim, m: map[string][2]int64{}}
}

func (o *aloneReplica) admit(key string, now time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	tk := now.UnixNano() / int64(o.lim.Tick)
	x := o.m[key]
	c := int64(0)
	if age := tk - x[1]; age < 63 {
		c = x[0] >> age
	}
	ok := c+rate.Unit <= int64(o.lim.Threshold)
	if ok {
		c += rate.Unit
	}
	o.m[key] = [2]int64{c, tk}
	return ok
}

// accCase is one line of the table: a limit, and clients at x times it,
// keys of them, each on its own key.
type accCase struct {
	requests float64
	per      time.Duration
	x        float64
	keys     int
}

func (c accCase) String() string {
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "min"}[c.per]
	return fmt.Sprintf("%g/%s at %gx", c.requests, unit, c.x)
}

// accTally is what a case's clients got from the fleet and what one
// replica alone admits on the same schedule, over each client's first
// 10 s and after them.
type accTally struct {
	mu                                             sync.Mutex
	sent, failed                                   int
	fleetFirst, aloneFirst, fleetAfter, aloneAfter int
}

func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// fleetDoor sends one request of key under case i to replica r and says
// whether it was admitted; ok is false if it failed.
type fleetDoor func(r, i int, key string) (admitted, ok bool)

// startAccuracyFleet starts Redis and n replicas at the fleet's default
// settings, each with one limit per case (rules, or Envoy descriptors
// with envoy), and returns the door to them and their admin URLs.
func startAccuracyFleet(t *testing.T, n int, cases []accCase, envoy bool) (fleetDoor, []string) {
	t.Helper()
	rs := startRedis(t, 0)
	bin := build(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	t.Cleanup(up.Close)
	var limits strings.Builder
	for i, c := range cases {
		if envoy {
			unit := map[time.Duration]string{time.Second: "second", time.Minute: "minute"}[c.per]
			fmt.Fprintf(&limits, "        - key: c%d\n          rate_limit: {unit: %s, requests_per_unit: %g}\n", i, unit, c.requests)
		} else {
			fmt.Fprintf(&limits, "  - name: c%d\n    match: {path_prefix: /c%d/}\n    key: [\"header:X-Key\"]\n    limits: [{name: rate, requests: %g, per: %v}]\n", i, i, c.requests, c.per)
		}
	}
	dir := t.TempDir()
	var urls, admins []string
	var conns []rlsv3.RateLimitServiceClient
	for r := range n {
		door := fmt.Sprintf("upstream: %q\nrules:\n%s", up.URL, limits.String())
		if envoy {
			door = fmt.Sprintf("envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: acc\n      descriptors:\n%s", limits.String())
		}
		cfg := filepath.Join(dir, fmt.Sprintf("r%d.yaml", r))
		os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: 127.0.0.1:0
new_keys: {disabled: true}
fleet:
  redis: %q
  secret: "test-secret-0123456789"
  id: r%d
%s`, rs.addr(), r, door)), 0o644)
		_, out := start(t, bin, "-config", cfg)
		admins = append(admins, "http://"+waitFor(t, out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1])
		if envoy {
			addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			conns = append(conns, rlsv3.NewRateLimitServiceClient(conn))
		} else {
			urls = append(urls, "http://"+waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1])
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range admins {
		for metricValue(t, a, "sketchproxy_fleet_replicas") != float64(n) || metricValue(t, a, "sketchproxy_fleet_up") != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("the %d replicas did not count each other through Redis", n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if envoy {
		return func(r, i int, key string) (bool, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := conns[r].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "acc", Descriptors: []*rlv3.RateLimitDescriptor{desc(fmt.Sprint("c", i), key)}})
			if err != nil {
				return false, false
			}
			switch resp.GetOverallCode() {
			case rlsv3.RateLimitResponse_OK:
				return true, true
			case rlsv3.RateLimitResponse_OVER_LIMIT:
				return false, true
			}
			return false, false
		}, admins
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 5 * time.Second}
	return func(r, i int, key string) (bool, bool) {
		return ask(client, fmt.Sprintf("%s/c%d/", urls[r], i), key)
	}, admins
}

// driveFleet sends every case's clients for 10 s plus after, each paced
// at its rate from its own moment in the first second, to the replicas in
// turn, and decides each request with aloneReplica at the instant it is
// sent: the ratio measures what the run achieved, whatever the machine's
// load did to the pace.
func driveFleet(t *testing.T, n int, cases []accCase, after time.Duration, door fleetDoor) []*accTally {
	tallies := make([]*accTally, len(cases))
	var wg sync.WaitGroup
	t0 := time.Now().Add(200 * time.Millisecond)
	for i, c := range cases {
		tl := &accTally{}
		tallies[i] = tl
		one := newAloneReplica(t, rate.Rate{Requests: c.requests, Per: c.per})
		gap := time.Duration(float64(c.per) / (c.x * c.requests))
		for k := range c.keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("case%d-client%d", i, k)
				start := t0.Add(time.Duration(k) * time.Second / time.Duration(c.keys))
				end := start.Add(10*time.Second + after)
				next := start
				for j := 0; ; j++ {
					time.Sleep(time.Until(next))
					now := time.Now()
					if now.After(end) {
						return
					}
					want := one.admit(key, now)
					got, ok := door((j+k)%n, i, key)
					first := now.Sub(start) < 10*time.Second
					tl.mu.Lock()
					tl.sent++
					switch {
					case !ok:
						tl.failed++
					case first:
						tl.fleetFirst += b2i(got)
						tl.aloneFirst += b2i(want)
					default:
						tl.fleetAfter += b2i(got)
						tl.aloneAfter += b2i(want)
					}
					tl.mu.Unlock()
					next = next.Add(gap)
				}
			}()
		}
	}
	wg.Wait()
	return tallies
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// checkAccuracy logs each case's ratios and fails a case whose limiter
// refused nothing, whose requests failed, or whose ratio is more than 5%
// off (after, only where after was measured). A count is also within its
// bound when it is off by at most one request a client: a replica decides
// at the time it receives a request, one alone at the client's send time,
// and on a busy machine the two fall on either side of a tick now and then
// (at 1 a second over 10 s a client's 11 requests cannot show 5%; the long
// run's counts can).
func checkAccuracy(t *testing.T, n int, cases []accCase, tallies []*accTally, admins []string, measuredAfter bool) {
	t.Helper()
	var cmds, claims, heard float64
	for _, a := range admins {
		cmds += metricValue(t, a, "sketchproxy_fleet_redis_commands_total")
		claims += metricValue(t, a, "sketchproxy_fleet_claims_total")
		heard += metricValue(t, a, "sketchproxy_fleet_claims_heard_total")
	}
	sent := 0
	for i, c := range cases {
		tl := tallies[i]
		sent += tl.sent
		first, after := ratio(tl.fleetFirst, tl.aloneFirst), ratio(tl.fleetAfter, tl.aloneAfter)
		t.Logf("N=%d %-14v %2d clients: first 10 s %5d/%5d = %.3f; after %6d/%6d = %.3f; %d sent, %d failed",
			n, c, c.keys, tl.fleetFirst, tl.aloneFirst, first, tl.fleetAfter, tl.aloneAfter, after, tl.sent, tl.failed)
		if tl.aloneFirst+tl.aloneAfter >= tl.sent-tl.failed {
			t.Errorf("N=%d %v: one replica alone would have refused nothing: the case measures no limit", n, c)
		}
		if tl.failed != 0 {
			t.Errorf("N=%d %v: %d requests failed", n, c, tl.failed)
		}
		off := func(fleet, alone int) bool {
			d := math.Abs(float64(fleet - alone))
			return d > 0.05*float64(alone) && d > float64(c.keys)
		}
		if off(tl.fleetFirst, tl.aloneFirst) || measuredAfter && off(tl.fleetAfter, tl.aloneAfter) {
			t.Errorf("N=%d %v: the fleet admitted %.3f (first 10 s) and %.3f (after) of what one replica alone admits, want within 5%%", n, c, first, after)
		}
	}
	t.Logf("N=%d: %.0f Redis commands for %d requests (%.4f a request), %.0f claims sent, %.0f heard", n, cmds, sent, cmds/float64(sent), claims, heard)
}

// N sketchproxy processes on one redis-server, at the fleet's default
// settings, behind this test's round-robin client: each client at x times
// its limit is admitted within 5% of what one replica alone admits on the
// same schedule. The default run is 3 replicas for 10 s, a limit of 10 a
// second at 3x and 1 a second at 10x, through both doors: the proxy and
// Envoy's rate-limit service (the same engine and fleet). With
// SKETCHPROXY_FLEET_LONG=1 it runs the table: N = 2, 3 and 5,
// limits from 1 a second to 1,000 a minute at 2x and 10x, measured over
// each client's first 10 s and over the 30 s (per-second limits) or 90 s
// (per-minute) after them.
func TestFleetAccuracy(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the fleet accuracy test runs about 30 s")
	}
	if os.Getenv("SKETCHPROXY_FLEET_LONG") == "1" {
		for _, n := range []int{2, 3, 5} {
			for _, g := range []struct {
				after time.Duration
				cases []accCase
			}{
				{30 * time.Second, []accCase{{1, time.Second, 2, 8}, {1, time.Second, 10, 8}, {10, time.Second, 2, 3}, {10, time.Second, 10, 2}, {50, time.Second, 2, 1}, {50, time.Second, 10, 1}}},
				{90 * time.Second, []accCase{{20, time.Minute, 2, 6}, {20, time.Minute, 10, 6}, {1000, time.Minute, 2, 2}, {1000, time.Minute, 10, 1}}},
			} {
				t.Run(fmt.Sprintf("N=%d/%v", n, g.after), func(t *testing.T) {
					door, admins := startAccuracyFleet(t, n, g.cases, false)
					checkAccuracy(t, n, g.cases, driveFleet(t, n, g.cases, g.after, door), admins, true)
				})
			}
		}
		return
	}
	cases := []accCase{{10, time.Second, 3, 3}, {1, time.Second, 10, 6}}
	for _, envoy := range []bool{false, true} {
		t.Run(map[bool]string{false: "proxy", true: "envoy"}[envoy], func(t *testing.T) {
			door, admins := startAccuracyFleet(t, 3, cases, envoy)
			checkAccuracy(t, 3, cases, driveFleet(t, 3, cases, 0, door), admins, false)
		})
	}
}
