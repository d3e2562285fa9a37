package engine

import (
	"bufio"
	"bytes"
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// oneRule is an engine with one rule of one limit, requests per per, on a
// manual clock.
func oneRule(t testing.TB, requests float64, per time.Duration) (*Engine, *Set, *epochsketch.ManualClock) {
	return compile(t, RuleSpec{Name: "api", Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: requests, Per: per}}}})
}

// decide is one request of key under the first rule, as every door runs
// it: one Decide, then Done once the request ends.
func decide(e *Engine, s *Set, key string, sc *Scratch) bool {
	sc.Reset()
	facts := [1]Fact{{Rule: s.Rules[0], Key: key}}
	d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts[:]}, sc)
	d.Done()
	return d.Admitted
}

// A client at a steady 2x or 4x its limit is admitted exactly its limit,
// for every integer limit from 1 to 40 a second: each request counts two
// (package rate), so the halving of an odd burst loses no half request.
func TestSteadyOverloadExactEveryLimit(t *testing.T) {
	for limit := 1; limit <= 40; limit++ {
		for _, over := range []int{2, 4} {
			e, s, clk := oneRule(t, float64(limit), time.Second)
			var sc Scratch
			gap := time.Second / time.Duration(over*limit)
			// A minute to settle, then a minute measured.
			admitted := 0
			for i := range 2 * 60 * over * limit {
				if decide(e, s, "k", &sc) && i >= 60*over*limit {
					admitted++
				}
				clk.Advance(gap)
			}
			want := 60 * limit
			top := int(float64(want)*(1+rate.Excess(uint32(limit)))) + 1
			if admitted < want || admitted > top {
				t.Errorf("%d/s at %dx: %d admitted in a minute, want %d to %d (the limit and its Excess)", limit, over, admitted, want, top)
			}
		}
	}
}

// Deciding one request of a known key under one rule allocates nothing
// once the request's Scratch is warm.
func TestDecideAllocates0(t *testing.T) {
	e, s, _ := oneRule(t, 1e6, time.Second)
	var sc Scratch
	decide(e, s, "192.0.2.1", &sc)
	if n := testing.AllocsPerRun(1000, func() { decide(e, s, "192.0.2.1", &sc) }); n != 0 {
		t.Errorf("a decision allocated %.1f times, want 0", n)
	}
}

// The state survives a write and a read into a freshly compiled set, and a
// damaged file leaves every sketch empty.
func TestStateRoundTrip(t *testing.T) {
	e, s, _ := oneRule(t, 10, time.Second)
	var sc Scratch
	for range 4 {
		decide(e, s, "k", &sc)
	}
	var b bytes.Buffer
	if _, err := e.WriteState(&b, s); err != nil {
		t.Fatal(err)
	}
	e2, s2, _ := oneRule(t, 10, time.Second)
	e2.opts.Seed, e2.opts.Clock = e.opts.Seed, e.opts.Clock
	if _, err := e2.ReadState(bufio.NewReader(bytes.NewReader(b.Bytes())), s2); err != nil {
		t.Fatal(err)
	}
	if got := e2.Estimate(s2.Rules[0], s2.Rules[0].Limits[0], "k"); got != 4 {
		t.Errorf("restored estimate %d, want 4", got)
	}
	if _, err := e2.ReadState(bufio.NewReader(bytes.NewReader(b.Bytes()[:b.Len()-3])), s2); err == nil {
		t.Error("a truncated state file was read")
	}
	if got := e2.Estimate(s2.Rules[0], s2.Rules[0].Limits[0], "k"); got != 0 {
		t.Errorf("after a rejected file the estimate is %d, want 0 (every sketch empty)", got)
	}
}

// BenchmarkDecide is the engine's cost for one rule of one limit, a
// request of a key it tracks that is admitted: Evaluate and Commit. The
// manual clock moves a millisecond every 1,000 requests (a million a
// second), so the key's count decays as a busy client's does and stays
// under its limit of 4 million a second.
func BenchmarkDecide(b *testing.B) {
	e, s, clk := oneRule(b, 4e6, time.Second)
	var sc Scratch
	decide(e, s, "192.0.2.1", &sc)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if !decide(e, s, "192.0.2.1", &sc) {
			b.Fatal("refused")
		}
		if i%1000 == 999 {
			clk.Advance(time.Millisecond)
		}
	}
}

// compile is an engine on a manual clock with the rules rs.
func compile(t testing.TB, rs ...RuleSpec) (*Engine, *Set, *epochsketch.ManualClock) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	e := New(Options{Clock: clk, Seed: 1})
	s, err := e.Compile(&Spec{
		Buckets: 1 << 10, Rules: rs,
		Tarpit:  TarpitSpec{DelayAbove: 1, DripAbove: 1.5, RejectAbove: 2, BanAbove: 8, BanFor: 10 * time.Minute, MaxHeld: 256, MaxHeldPerKey: 2},
		NewKeys: NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Retire(s, nil) })
	return e, s, clk
}

// A limit whose burst is not whole (2.5 a second: a threshold of 3) is
// still exact: the tick follows the threshold the sketch counts to.
func TestFractionalLimitExact(t *testing.T) {
	for _, c := range []struct{ requests, per float64 }{{2.5, 1}, {0.5, 1}, {7.5, 60}, {1.25, 1}} {
		per := time.Duration(c.per * float64(time.Second))
		e, s, clk := compile(t, RuleSpec{Name: "api", Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: c.requests, Per: per}}}})
		var sc Scratch
		window := 400 * per
		gap := time.Duration(float64(per) / (3 * c.requests)) // 3x over
		admitted := 0
		for start := clk.Now(); clk.Now().Sub(start) < 2*window; clk.Advance(gap) {
			if decide(e, s, "k", &sc) && clk.Now().Sub(start) >= window {
				admitted++
			}
		}
		want := 400 * c.requests
		if got := float64(admitted); got < 0.99*want || got > 1.01*want {
			t.Errorf("%v per %v at 3x: %d admitted in %v, want %v (to 1%%)", c.requests, per, admitted, window, want)
		}
	}
}

// A wallet spent at a steady 3x its budget is admitted its budget, for
// odd budgets too (every unit counts two, as a request of a limit does).
func TestWalletSteadyOverloadExact(t *testing.T) {
	for _, units := range []float64{1, 2, 5, 7, 10} {
		e, s, clk := compile(t, RuleSpec{Name: "w", Budget: &BudgetSpec{Name: "b", Units: units, Per: time.Second, Unit: 1, Cost: 1, Reserve: 1}})
		ru := s.Rules[0]
		var sc Scratch
		gap := time.Second / time.Duration(3*units)
		admitted := 0
		for i := range int(3 * units * 400) {
			// The request ends at once: Done gives its reservation back.
			if decide(e, s, "k", &sc) && i >= int(3*units*200) {
				admitted++
			}
			clk.Advance(gap)
		}
		if want := 200 * units; float64(admitted) < 0.99*want || float64(admitted) > 1.01*want {
			t.Errorf("%v units a second at 3x: %d admitted in 200 s, want %v (to 1%%)", units, admitted, want)
		}
		if got := e.Spent(ru, "k"); got > uint64(units) {
			t.Errorf("%v units a second: Spent says %d, over the budget", units, got)
		}
	}
}

// decideRule is decide under rule i of s.
func decideRule(e *Engine, s *Set, i int, key string, sc *Scratch) bool {
	sc.Reset()
	facts := [1]Fact{{Rule: s.Rules[i], Key: key}}
	d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts[:]}, sc)
	d.Done()
	return d.Admitted
}

// No rule's traffic makes the engine forget another rule's clients at
// their limit: a 1,000-an-hour rule's 5,000 values at 25 calls each (2.5%
// of their limit) beside three tenants of a 20-an-hour rule at 100% of
// theirs, on a small table. With one sketch per tick (the rules' ticks are
// equal) the flood's counts, 50, beat the tenants', 40, and each tenant got
// its 20 again. Limits with the same tick but other thresholds now count
// in sketches of their own (sketchKey).
func TestNoRuleEvictsAnothersClients(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	e := New(Options{Clock: clk, Seed: 1})
	s, err := e.Compile(&Spec{
		Buckets: 1 << 4,
		Rules: []RuleSpec{
			{Name: "tenants", Limits: []LimitSpec{{Name: "h", Rate: rate.Rate{Requests: 20, Per: time.Hour}}}},
			{Name: "values", Limits: []LimitSpec{{Name: "h", Rate: rate.Rate{Requests: 1000, Per: time.Hour}}}},
		},
		NewKeys: NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
		Tarpit:  TarpitSpec{BanFor: time.Minute},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Retire(s, nil)
	var sc Scratch
	for _, tenant := range []string{"t1", "t2", "t3"} {
		for i := range 20 {
			if !decideRule(e, s, 0, tenant, &sc) {
				t.Fatalf("%s: request %d of its 20 refused", tenant, i+1)
			}
		}
		if decideRule(e, s, 0, tenant, &sc) {
			t.Fatalf("%s: a 21st request admitted before the flood", tenant)
		}
	}
	for v := range 5000 {
		for range 25 {
			decideRule(e, s, 1, "value"+strconv.Itoa(v), &sc)
		}
	}
	for _, tenant := range []string{"t1", "t2", "t3"} {
		if decideRule(e, s, 0, tenant, &sc) {
			t.Errorf("%s, at its limit before the flood, was admitted after it: the other rule's values evicted it", tenant)
		}
	}
	admitted := 0
	for range 40 {
		if decideRule(e, s, 0, "fresh", &sc) {
			admitted++
		}
	}
	if admitted > 20 {
		t.Errorf("a fresh tenant got %d of 20", admitted)
	}
}

// Requests racing on one key at one instant are admitted the burst,
// exactly, together: each limit's check and count is one conditional add.
// With the check and the count apart, two racers that both saw room for
// the last request were both admitted. Run under -race.
func TestRacingRequestsNeverPassTheLimit(t *testing.T) {
	for _, rules := range [][]RuleSpec{
		{{Name: "one", Limits: []LimitSpec{{Name: "s", Rate: rate.Rate{Requests: 100, Per: time.Second}}}}},
		{{Name: "two", Limits: []LimitSpec{
			{Name: "s", Rate: rate.Rate{Requests: 100, Per: time.Second}},
			{Name: "m", Rate: rate.Rate{Requests: 1000, Per: time.Minute}},
		}}},
	} {
		e, s, _ := compile(t, rules...)
		const goroutines, calls = 8, 100
		var admitted atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var sc Scratch
				<-start
				for range calls {
					if decide(e, s, "hot", &sc) {
						admitted.Add(1)
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		if n := admitted.Load(); n != 100 {
			t.Errorf("%s: %d goroutines racing on one key were admitted %d, want exactly the burst, 100", rules[0].Name, goroutines, n)
		}
	}
}
