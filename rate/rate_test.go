package rate_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
	"github.com/epochsketch/epochsketch/rate"
)

// compile compiles r for a halving sketch: most of this file tests the
// halving arithmetic, which fleets and wallets count with
// (smooth_test.go tests smooth decay's).
func compile(t *testing.T, r rate.Rate) rate.Limit {
	t.Helper()
	l, err := r.CompileHalving()
	if err != nil {
		t.Fatalf("%+v: %v", r, err)
	}
	return l
}

func TestCompile(t *testing.T) {
	for _, c := range []struct {
		r     rate.Rate
		burst uint32
		tick  time.Duration
		q, w  int64
	}{
		{rate.Rate{Requests: 10, Per: time.Second}, 10, 500 * time.Millisecond, 10, 1},
		{rate.Rate{Requests: 10, Per: time.Second, Burst: 20}, 20, time.Second, 10, 1},
		{rate.Rate{Requests: 100, Per: time.Minute}, 100, 30 * time.Second, 100, 60},
		{rate.Rate{Requests: 5, Per: 10 * time.Second}, 5, 5 * time.Second, 5, 10},
		{rate.Rate{Requests: 50000, Per: 24 * time.Hour}, 50000, 12 * time.Hour, 50000, 86400},
		{rate.Rate{Requests: 2.5, Per: time.Second}, 3, 600 * time.Millisecond, 5, 2},
		{rate.Rate{Requests: 0.5, Per: time.Second}, 1, time.Second, 1, 2},
		{rate.Rate{Requests: 10, Per: 500 * time.Millisecond}, 10, 250 * time.Millisecond, 20, 1},
		{rate.Rate{Requests: 7, Per: time.Second, Burst: 3}, 3, 214285714, 7, 1},
		{rate.Rate{Requests: 3, Per: 1500 * time.Millisecond}, 3, 750 * time.Millisecond, 6, 3},
		{rate.Rate{Requests: 10, Per: 333 * time.Millisecond}, 10, 166500 * time.Microsecond, 10000, 333},
		{rate.Rate{Requests: 1e12, Per: 24 * time.Hour}, rate.MaxBurstHalving, 362387822, 1e12, 86400},
	} {
		l := compile(t, c.r)
		if l.Burst != c.burst || l.Tick != c.tick || l.Q != c.q || l.W != c.w || l.Threshold != rate.Unit*c.burst {
			t.Errorf("%+v: burst %d tick %v θ %d q=%d;w=%d, want burst %d tick %v q=%d;w=%d",
				c.r, l.Burst, l.Tick, l.Threshold, l.Q, l.W, c.burst, c.tick, c.q, c.w)
		}
	}
}

// The counts a limit writes stay within the sketch's: a key held at the
// threshold, plus what one more request adds, never parks at MaxCount.
func TestMaxBurstFitsTheSketch(t *testing.T) {
	if uint64(rate.MaxBurstHalving)*rate.Unit > epochsketch.MaxCount {
		t.Fatalf("MaxBurstHalving × Unit = %d passes epochsketch.MaxCount %d", uint64(rate.MaxBurstHalving)*rate.Unit, epochsketch.MaxCount)
	}
	if uint64(rate.MaxBurst)*rate.Unit+1 > admit.MaxCount {
		t.Fatalf("MaxBurst × Unit + 1 = %d passes a smooth sketch's %d", uint64(rate.MaxBurst)*rate.Unit+1, admit.MaxCount)
	}
	if rate.MinTick != epochsketch.MinTickDuration {
		t.Fatalf("MinTick %v, the sketch's %v", rate.MinTick, epochsketch.MinTickDuration)
	}
}

func TestCompileErrors(t *testing.T) {
	for _, c := range []struct {
		r           rate.Rate
		field, says string
	}{
		{rate.Rate{Requests: 0, Per: time.Second}, "Requests", "positive"},
		{rate.Rate{Requests: -1, Per: time.Second}, "Requests", "positive"},
		{rate.Rate{Requests: 10, Per: 0}, "Per", "positive duration"},
		{rate.Rate{Requests: 10, Per: time.Second, Burst: -1}, "Burst", "want 1 to"},
		{rate.Rate{Requests: 10, Per: time.Second, Burst: 0.2}, "Burst", "rounds to 0"},
		{rate.Rate{Requests: 10, Per: time.Second, Burst: 1 << 24}, "Burst", "want 1 to"},
		{rate.Rate{Requests: 10000, Per: time.Second, Burst: 10}, "Burst", "raise the burst to at least 20"},
		{rate.Rate{Requests: 1e15, Per: time.Second}, "Per", "write the rate over a Per"},
		{rate.Rate{Requests: 1, Per: time.Duration(1 << 62), Burst: 100}, "Per", "292 years"},
	} {
		_, err := c.r.CompileHalving()
		var re *rate.Error
		if !errors.As(err, &re) || re.Field != c.field || !strings.Contains(re.Msg, c.says) {
			t.Errorf("%+v: %v, want a %s error saying %q", c.r, err, c.field, c.says)
		}
	}
}

// steady runs one key at factor times its limit through a sketch, admitting
// a request when it fits (and counting only admitted ones), and returns the
// requests admitted per Per after a warm-up.
func steady(t *testing.T, l rate.Limit, factor float64) float64 {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: l.Tick, Clock: clk, Seed: 1})
	defer sk.Close()
	gap := time.Duration(float64(l.Per) / (l.Requests * factor))
	warm, run := 10*l.Per, 40*l.Per
	admitted := 0
	for start := clk.Now(); clk.Now().Sub(start) < warm+run; clk.Advance(gap) {
		if l.Wait(sk.Estimate("k"), rate.Unit, clk.Now()) > 0 {
			continue
		}
		sk.ObserveN(time.Time{}, "k", rate.Unit)
		if clk.Now().Sub(start) >= warm {
			admitted++
		}
	}
	return float64(admitted) / 40
}

// Every limit is exact at steady overload, odd bursts included, and a
// client at the limit (evenly spread) is never refused.
func TestSteadyOverloadExact(t *testing.T) {
	for _, r := range []rate.Rate{
		{Requests: 1, Per: time.Second}, {Requests: 3, Per: time.Second},
		{Requests: 5, Per: time.Second}, {Requests: 10, Per: time.Second},
		{Requests: 2.5, Per: time.Second}, {Requests: 25, Per: time.Minute},
		{Requests: 7, Per: time.Second, Burst: 3}, {Requests: 10, Per: time.Second, Burst: 20},
	} {
		l := compile(t, r)
		for _, f := range []float64{1, 2, 4} {
			t.Run(fmt.Sprintf("%g-per-%v-burst-%d/x%g", r.Requests, r.Per, l.Burst, f), func(t *testing.T) {
				got := steady(t, l, f)
				if got < r.Requests*0.99 || got > r.Requests*1.01 {
					t.Errorf("admitted %.3f per %v at %gx, want %g ± 1%%", got, r.Per, f, r.Requests)
				}
			})
		}
	}
}

func TestWaitAndStatus(t *testing.T) {
	l := compile(t, rate.Rate{Requests: 10, Per: time.Second}) // θ 20, tick 500ms
	now := time.Unix(1_700_000_000, 100*int64(time.Millisecond))
	if d := l.Wait(18, 2, now); d != 0 {
		t.Errorf("a request that fits waits %v", d)
	}
	// 20 halves to 10 at the next tick (400ms away): room for one.
	if d := l.Wait(20, 2, now); d != 400*time.Millisecond {
		t.Errorf("Wait(20, 2) = %v, want 400ms", d)
	}
	// 22 more counts than θ never fit: the wait is until the count is 0.
	if d := l.Wait(20, 22, now); d != 400*time.Millisecond+4*500*time.Millisecond {
		t.Errorf("Wait(20, 22) = %v, want 2.4s", d)
	}
	if r, tt, over := l.Status(6, 2, now); r != 7 || tt != 400*time.Millisecond || over {
		t.Errorf("Status(6) = %d, %v, %v; want 7, 400ms, false", r, tt, over)
	}
	if r, tt, over := l.Status(20, 2, now); r != 0 || tt != 400*time.Millisecond || !over {
		t.Errorf("Status(20) = %d, %v, %v; want 0, 400ms, true", r, tt, over)
	}
	b, over := l.AppendItem(nil, `"api"`, 0, 2, now)
	if string(b) != `"api";r=10;t=1` || over {
		t.Errorf("AppendItem = %s, %v", b, over)
	}
	if p := l.PolicyItem(`"api"`); p != `"api";q=10;w=1` {
		t.Errorf("PolicyItem = %s", p)
	}
}

// A Burst above Q still says at most Q remaining: the field's r is a
// share of the policy's quota.
func TestItemNeverAboveQuota(t *testing.T) {
	l := compile(t, rate.Rate{Requests: 10, Per: time.Second, Burst: 20})
	b, _ := l.AppendItem(nil, `"p"`, 0, rate.Unit, time.Unix(0, 0))
	if string(b) != `"p";r=10;t=1` {
		t.Errorf("got %s, want r capped at q=10", b)
	}
}

func TestWholePolicy(t *testing.T) {
	for _, c := range []struct {
		req  float64
		per  time.Duration
		q, w int64
	}{
		{10, time.Second, 10, 1}, {2.5, time.Minute, 5, 120}, {10, 500 * time.Millisecond, 20, 1},
		{3, 1500 * time.Millisecond, 6, 3}, {1, 24 * time.Hour, 1, 86400},
		{1, 1234567 * time.Microsecond, 1, 2}, // no m up to 1000 fits: rounded down
	} {
		if q, w := rate.WholePolicy(c.req, c.per); q != c.q || w != c.w {
			t.Errorf("%g per %v: q=%d;w=%d, want q=%d;w=%d", c.req, c.per, q, w, c.q, c.w)
		}
	}
}

func TestSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 1, 1: 1, time.Second: 1, time.Second + 1: 2, 90 * time.Second: 90} {
		if got := rate.Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// Wait is honest: at now + Wait the count, halved once per tick crossed,
// leaves room for the hits, and a nanosecond earlier it does not (a client
// that retries early is refused, one that waits it out passes), for random
// counts, hits and instants.
func TestWaitIsHonest(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, r := range []rate.Rate{{Requests: 10, Per: time.Minute}, {Requests: 7, Per: time.Second, Burst: 3}, {Requests: 2.5, Per: time.Second}} {
		l := compile(t, r)
		for range 20000 {
			est := uint32(rng.IntN(int(4 * l.Threshold)))
			add := rate.Counts(uint64(1 + rng.IntN(int(l.Burst))))
			now := time.Unix(1_700_000_000, rng.Int64N(int64(time.Hour)))
			w := l.Wait(est, add, now)
			fits := func(at time.Time) bool {
				k := at.UnixNano()/int64(l.Tick) - now.UnixNano()/int64(l.Tick)
				return uint64(est>>min(k, 31))+uint64(add) <= uint64(l.Threshold)
			}
			if w == 0 {
				if !fits(now) {
					t.Fatalf("%+v: count %d, %d more: Wait 0 but they do not fit", r, est, add)
				}
				continue
			}
			if !fits(now.Add(w)) || fits(now.Add(w-1)) {
				t.Fatalf("%+v: count %d, %d more, at %v: Wait %v is not the first instant they fit", r, est, add, now, w)
			}
		}
	}
}

// TestLongWaitsSaturate: a wait past a time.Duration's 292 years (a tick
// of 146 years, 3 ticks on) reads as the longest Duration, never as a
// negative one, and Seconds rounds the longest Duration up without
// overflowing: a negative wait would tell a client to retry in 1 s and
// make a waiter spin.
func TestLongWaitsSaturate(t *testing.T) {
	const year = 365 * 24 * time.Hour
	now := time.Unix(1_800_000_000, 0)
	if got := rate.UntilTick(now, 146*year, 3); got != math.MaxInt64 {
		t.Errorf("UntilTick 3 ticks of 146 years on: %v, want the longest Duration", got)
	}
	if got, want := rate.UntilTick(now, 146*year, 1), 146*year-time.Duration(now.UnixNano()); got != want {
		t.Errorf("UntilTick 1 tick of 146 years on: %v, want %v", got, want)
	}
	l := compile(t, rate.Rate{Requests: 3, Per: 292 * year})
	if w := l.Wait(l.Threshold, l.Threshold, now); w != math.MaxInt64 {
		t.Errorf("Wait for a whole burst of 3 per 292 years: %v, want the longest Duration", w)
	}
	if got := rate.Seconds(math.MaxInt64); got != math.MaxInt64/int64(time.Second)+1 {
		t.Errorf("Seconds(the longest Duration) = %d, want %d", got, math.MaxInt64/int64(time.Second)+1)
	}
}
