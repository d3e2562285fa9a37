package limit_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/rate"
)

// windowLimits are the limits the window bound is checked on: every Burst
// from 1 up, odd ones, one above 2 × Requests and one far below.
var windowLimits = []limit.Config{
	{Requests: 1, Per: time.Minute},
	{Requests: 1, Per: time.Hour},
	{Requests: 2, Per: time.Second},
	{Requests: 7, Per: time.Second},
	{Requests: 100, Per: time.Minute},
	{Requests: 100, Per: time.Minute, Burst: 25},
	{Requests: 10, Per: time.Minute, Burst: 50},
	{Requests: 5, Per: time.Second, Burst: 3},
	{Requests: 60, Per: time.Minute, Burst: 1},
}

// windowExcess is the e of the window bound (package rate, The window
// bound): in any window of length w, sliding, a key is admitted at most
// Burst × 17/16 + Requests × (1 + e) × w/Per + 1, at any overload pattern.
const windowExcess = 0.05

// maxInWindow is the most of the sorted instants ts within any window
// [s, s+w).
func maxInWindow(ts []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// pattern is one overload pattern: when a client asks, from idle.
type pattern struct {
	name string
	next func(rng *rand.Rand, at time.Duration, per time.Duration) time.Duration
}

var patterns = []pattern{
	// Every two-thousandth of Per (at least a millisecond): admitted about
	// the instant room appears.
	{"flood", func(_ *rand.Rand, at, per time.Duration) time.Duration { return at + max(time.Millisecond, per/2000) }},
	// Bursts of asks at random instants, idle in between.
	{"bursts", func(rng *rand.Rand, at, per time.Duration) time.Duration {
		if rng.IntN(8) == 0 {
			return at + time.Duration(rng.Int64N(int64(per)))
		}
		return at + time.Microsecond
	}},
	// A burst just before a tick's end (TestWindowBound places it), then
	// the flood.
	{"edge", func(_ *rand.Rand, at, per time.Duration) time.Duration { return at + max(time.Millisecond, per/2000) }},
	// Random gaps up to a tenth of Per.
	{"random", func(rng *rand.Rand, at, per time.Duration) time.Duration {
		return at + time.Duration(rng.Int64N(int64(per)/10)+1)
	}},
}

// TestWindowBound: in any window of length Per, and of half and a tenth
// of it, a key is admitted at most Burst × 17/16 + Requests × (1 + e) ×
// w/Per + 1 (the sixteenth: a step of the count's decay that the window
// catches whole; the one: a request whose room opened just before it),
// whatever the pattern, from idle at any phase of the tick, on a
// ManualClock. It fails on a sketch that halves at the tick's end, where
// a key gets 1.5 × Burst within a millisecond.
func TestWindowBound(t *testing.T) {
	for _, c := range windowLimits {
		for _, p := range patterns {
			t.Run(fmt.Sprintf("%s/%s", name(c), p.name), func(t *testing.T) {
				burst := c.Burst
				if burst == 0 {
					burst = c.Requests
				}
				worst := map[int]float64{}
				for seed := range uint64(6) {
					rng := rand.New(rand.NewPCG(seed, 45))
					l, clk := newManual(t, c)
					clk.Advance(time.Duration(rng.Int64N(int64(c.Per)))) // any phase
					var ts []time.Duration
					span := 12 * c.Per
					base := t0.Add(time.Duration(seed) * time.Hour)
					if p.name == "edge" {
						// The whole burst at once, a thousandth of Per
						// before a tick's end, then a request every
						// millisecond: where halving counts gave half the
						// burst back at once.
						lim, err := rate.Rate{Requests: float64(c.Requests), Per: c.Per, Burst: float64(c.Burst)}.Compile()
						if err != nil {
							t.Fatal(err)
						}
						ns, tick := base.UnixNano(), int64(lim.Tick)
						base = base.Add(time.Duration(tick - ns%tick - int64(c.Per)/1000))
						for range burst + 1 {
							if l.AllowN(base, "k", 1) {
								ts = append(ts, 0)
							}
						}
					}
					for at := time.Duration(0); at < span; at = p.next(rng, at, c.Per) {
						if l.AllowN(base.Add(at), "k", 1) {
							ts = append(ts, at)
						}
					}
					if len(ts) == 0 || len(ts) > burst+13*c.Requests*2 {
						t.Fatalf("seed %d: %d admitted in %v: the limiter did not run", seed, len(ts), span)
					}
					sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
					for _, div := range []int{1, 2, 10} {
						w := c.Per / time.Duration(div)
						got := maxInWindow(ts, w)
						bound := float64(burst)*17/16 + float64(c.Requests)*(1+windowExcess)/float64(div) + 1
						if float64(got) > bound {
							t.Errorf("seed %d: %d admitted within %v, want at most %.1f (Burst %d × 17/16 + Requests %d × %.2f × 1/%d + 1)", seed, got, w, bound, burst, c.Requests, 1+windowExcess, div)
						}
						worst[div] = max(worst[div], float64(got-burst)/float64(c.Requests)*float64(div))
					}
				}
				t.Logf("most admitted beyond the Burst, in Requests per window: Per %.3f, Per/2 %.3f, Per/10 %.3f", worst[1], worst[2], worst[10])
			})
		}
	}
}
