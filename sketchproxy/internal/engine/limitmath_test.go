package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

func TestLimitMapping(t *testing.T) {
	for _, c := range []struct {
		req   float64
		per   time.Duration
		burst float64
		tick  time.Duration
		theta uint32
	}{
		{100, time.Minute, 100, 30 * time.Second, 100},
		{10, time.Second, 20, time.Second, 20},
		{5, 10 * time.Second, 5, 5 * time.Second, 5},
		{50000, 24 * time.Hour, 50000, 12 * time.Hour, 50000},
	} {
		if got := TickFor(c.req, c.per, c.burst); got != c.tick {
			t.Errorf("%g per %v burst %g: tick %v, want %v", c.req, c.per, c.burst, got, c.tick)
		}
		if got := thresholdFor(c.burst); got != c.theta {
			t.Errorf("threshold %d, want %d", got, c.theta)
		}
	}
}

// steady sends one key's requests at a fixed rate for a while and returns
// the fraction refused after a warm-up, using the sketch and the mapping the
// proxy uses.
func steady(t *testing.T, req float64, per time.Duration, burst, factor float64) float64 {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	tick := TickFor(req, per, burst)
	theta := thresholdFor(burst)
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: tick, Clock: clk, Seed: 1})
	gap := time.Duration(float64(per) / (req * factor))
	var sent, refused int
	for i := 0; i < int(40*req*factor); i++ {
		est, _ := sk.Observe("k")
		if i > int(10*req*factor) {
			sent++
			if est > theta {
				refused++
			}
		}
		clk.Advance(gap)
	}
	return float64(refused) / float64(sent)
}

// The mapping's promise: a client at the limit is never refused, one well
// over it mostly is.
func TestLimitAccuracySteadyRates(t *testing.T) {
	for _, c := range []struct {
		req   float64
		per   time.Duration
		burst float64
	}{
		{100, time.Minute, 100}, {10, time.Second, 20}, {600, time.Minute, 100},
	} {
		name := fmt.Sprintf("%g per %v burst %g", c.req, c.per, c.burst)
		if f := steady(t, c.req, c.per, c.burst, 0.95); f != 0 {
			t.Errorf("%s: at 0.95x the limit %.3f refused, want 0", name, f)
		}
		if f := steady(t, c.req, c.per, c.burst, 2); f < 0.9 {
			t.Errorf("%s: at 2x the limit only %.3f refused", name, f)
		}
	}
}

// A quiet client gets its burst at once, and Retry-After is honest: waiting
// it out makes the next request pass, and a second less does not.
func TestBurstAndRetryAfter(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_003, 0))
	tick := TickFor(10, time.Minute, 10) // 30 s
	theta := thresholdFor(10)
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: tick, Clock: clk, Seed: 1})
	for i := range 10 {
		if est, _ := sk.Observe("k"); est > theta {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	for range 30 {
		sk.Observe("k") // hammering: counted too
	}
	est := sk.Estimate("k")
	ra := RetryAfter(est, 1, theta, clk.Now(), tick)
	if ra <= 0 || ra > 24*tick {
		t.Fatalf("retry after %v", ra)
	}
	if est2 := sk.EstimateAt(clk.Now().Add(ra-time.Second), "k"); est2+1 <= theta {
		t.Errorf("a second before Retry-After the next request would already pass (%d)", est2)
	}
	clk.Advance(ra)
	if est, _ := sk.Observe("k"); est > theta {
		t.Errorf("after Retry-After (%v) the request reads %d > %d", ra, est, theta)
	}
}
