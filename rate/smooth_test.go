package rate_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
	"github.com/epochsketch/epochsketch/rate"
)

// TestCompileSmooth: a limit compiles for smooth decay with a threshold of
// its burst and one count more, and a tick that lets a key spreading its
// requests evenly at the limit through: about Burst · ln 2 requests a
// tick, 1/log2(3) ticks a request for a Burst of 1.
func TestCompileSmooth(t *testing.T) {
	for _, c := range []struct {
		r     rate.Rate
		burst uint32
		perT  float64 // requests per tick at the even rate
	}{
		{rate.Rate{Requests: 1, Per: time.Minute}, 1, 1 / math.Log2(1+33.0/16)},
		{rate.Rate{Requests: 10, Per: time.Second}, 10, 1 / math.Log2(1+33.0/(16*19))},
		{rate.Rate{Requests: 100, Per: time.Minute, Burst: 25}, 25, 1 / math.Log2(1+33.0/(16*49))},
		{rate.Rate{Requests: 1e12, Per: 24 * time.Hour}, rate.MaxBurst, 1 / math.Log2(1+33.0/(16*(2*rate.MaxBurst-1)))},
	} {
		l, err := c.r.Compile()
		if err != nil {
			t.Fatalf("%+v: %v", c.r, err)
		}
		want := time.Duration(float64(c.r.Per) * c.perT / c.r.Requests)
		if l.Burst != c.burst || l.Threshold != rate.Unit*c.burst+1 || l.Tick != want || l.Halving() {
			t.Errorf("%+v: burst %d θ %d tick %v, want burst %d θ %d tick %v", c.r, l.Burst, l.Threshold, l.Tick, c.burst, rate.Unit*c.burst+1, want)
		}
	}
	if e := rate.Excess(1); e < 0.01 || e > 0.03 {
		t.Errorf("Excess(1) = %.4f, want 1%% to 3%%", e)
	}
	if e := rate.Excess(100); e < 0.01 || e > 0.03 {
		t.Errorf("Excess(100) = %.4f, want 1%% to 3%%", e)
	}
}

// smoothSteady is steady on a smooth sketch, through the conditional add.
func smoothSteady(l rate.Limit, factor float64) float64 {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: l.Tick, Clock: clk, Seed: 1})
	defer sk.Close()
	admit.SetSmooth(sk)
	add, _ := admit.Bind(sk)
	gap := time.Duration(float64(l.Per) / (l.Requests * factor))
	warm, run := 10*l.Per, 40*l.Per
	admitted := 0
	for start := clk.Now(); clk.Now().Sub(start) < warm+run; clk.Advance(gap) {
		if _, ok := add(time.Time{}, "k", rate.Unit, l.Threshold); ok && clk.Now().Sub(start) >= warm {
			admitted++
		}
	}
	return float64(admitted) / 40
}

// TestSmoothSteady: at steady overload a smooth limit admits its rate and
// at most Excess more, odd and small bursts included; a client at the
// limit, evenly spread, is admitted every time.
func TestSmoothSteady(t *testing.T) {
	for _, r := range []rate.Rate{
		{Requests: 1, Per: time.Second}, {Requests: 3, Per: time.Second},
		{Requests: 10, Per: time.Second}, {Requests: 2.5, Per: time.Second},
		{Requests: 25, Per: time.Minute}, {Requests: 7, Per: time.Second, Burst: 3},
		{Requests: 10, Per: time.Second, Burst: 20},
	} {
		l, err := r.Compile()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []float64{1, 2, 4} {
			t.Run(fmt.Sprintf("%g-per-%v-burst-%d/x%g", r.Requests, r.Per, l.Burst, f), func(t *testing.T) {
				got := smoothSteady(l, f)
				top := r.Requests * (1 + rate.Excess(l.Burst)) * 1.01
				if f == 1 && got < r.Requests*0.999 || got < r.Requests*0.99 || got > top {
					t.Errorf("admitted %.3f per %v at %gx, want %g to %.3f", got, r.Per, f, r.Requests, top)
				}
			})
		}
	}
}

// TestSmoothWaitExact: over random counts and instants, WaitFor names the
// first nanosecond at which a smooth sketch admits the requests.
func TestSmoothWaitExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, r := range []rate.Rate{{Requests: 1, Per: time.Minute}, {Requests: 5, Per: time.Second, Burst: 7}, {Requests: 100, Per: time.Minute}} {
		l, err := r.Compile()
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, rng.Int64N(int64(time.Hour))))
			sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: l.Tick, Clock: clk, Seed: 1})
			admit.SetSmooth(sk)
			add, _ := admit.Bind(sk)
			for range 1 + rng.IntN(int(l.Burst)+2) {
				add(time.Time{}, "k", rate.Unit, l.Threshold)
				clk.Advance(time.Duration(rng.Int64N(int64(l.Tick) / 8)))
			}
			n := uint32(1 + rng.IntN(int(l.Burst)))
			rd, ok := add(time.Time{}, "k", rate.Counts(uint64(n)), l.Threshold)
			if ok {
				sk.Close()
				continue
			}
			w := l.WaitFor(rd, rate.Counts(uint64(n)), clk.Now())
			if w <= 0 || w == math.MaxInt64 {
				t.Fatalf("case %d: a refusal waits %v", i, w)
			}
			if _, ok := add(clk.Now().Add(w-1), "k", rate.Counts(uint64(n)), l.Threshold); ok {
				t.Fatalf("case %d: %d admitted 1 ns before the wait %v", i, n, w)
			}
			if _, ok := add(clk.Now().Add(w), "k", rate.Counts(uint64(n)), l.Threshold); !ok {
				t.Fatalf("case %d: %d refused at the wait %v", i, n, w)
			}
			sk.Close()
		}
	}
}
