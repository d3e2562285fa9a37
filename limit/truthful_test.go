package limit_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/limit"
)

// TestFieldsTruthful: over random histories on a ManualClock, for Bursts
// of 1, 2, an odd one and a large one, what Decide tells a client is
// exact: a refused client that comes back RetryAfter later is admitted,
// and 1 ns earlier is still refused; a client told Remaining 0 and Reset
// finds a request fits at Reset. (With a Burst of 1, an admitted request
// used to be told the next tick, when its quota came back only at the one
// after.)
func TestFieldsTruthful(t *testing.T) {
	for _, c := range []limit.Config{
		{Requests: 1, Per: time.Minute},
		{Requests: 1, Per: time.Hour},
		{Requests: 2, Per: time.Second},
		{Requests: 3, Per: time.Second},
		{Requests: 100, Per: time.Minute},
		{Requests: 10, Per: time.Second, Burst: 1},
		{Requests: 5, Per: time.Second, Burst: 7},
	} {
		t.Run(name(c), func(t *testing.T) {
			var refusals, resets int
			for seed := range uint64(10) {
				rng := rand.New(rand.NewPCG(seed, 3))
				l, clk := newManual(t, c)
				clk.Advance(time.Duration(rng.Int64N(int64(c.Per))))
				fits := func(at time.Duration, n int) bool {
					clk.Advance(at)
					return l.Decide(time.Time{}, "k", 0).Remaining >= n
				}
				for range 300 {
					n := 1
					if rng.IntN(4) == 0 {
						n = 1 + rng.IntN(max(1, c.Burst, c.Requests))
					}
					d := l.Decide(time.Time{}, "k", n)
					switch {
					case !d.Allowed && d.RetryAfter > 0:
						refusals++
						if fits(d.RetryAfter-time.Nanosecond, n) {
							t.Fatalf("seed %d: %d fit 1 ns before RetryAfter %v", seed, n, d.RetryAfter)
						}
						if !fits(time.Nanosecond, n) {
							t.Fatalf("seed %d: %d do not fit at RetryAfter %v", seed, n, d.RetryAfter)
						}
					case d.Allowed && d.Remaining == 0 && rng.IntN(3) > 0:
						resets++
						if !fits(d.Reset, 1) {
							t.Fatalf("seed %d: no request fits at Reset %v", seed, d.Reset)
						}
					}
					clk.Advance(time.Duration(rng.Int64N(int64(c.Per) / int64(2*c.Requests))))
				}
			}
			if refusals == 0 || resets == 0 {
				t.Fatalf("%d refusals and %d spent quotas checked: the limiter did not run", refusals, resets)
			}
			t.Log(fmt.Sprintf("%d refusals, %d spent quotas checked", refusals, resets))
		})
	}
}
