package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// windowRun is one key's admissions through an engine counting limits
// smoothly or by halving, for a pattern of asks, from a random phase.
func windowRun(t testing.TB, halving bool, r rate.Rate, pattern string, seed uint64) (ts []time.Duration, refused int) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	e := New(Options{Clock: clk, Seed: 1, Halving: halving})
	s, err := e.Compile(&Spec{
		Buckets: 1 << 10, Rules: []RuleSpec{{Name: "api", Limits: []LimitSpec{{Name: "rate", Rate: r}}}},
		Tarpit:  TarpitSpec{DelayAbove: 1, DripAbove: 1.5, RejectAbove: 2, BanAbove: 8, BanFor: 10 * time.Minute, MaxHeld: 256, MaxHeldPerKey: 2},
		NewKeys: NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Retire(s, nil)
	rng := rand.New(rand.NewPCG(seed, 11))
	clk.Advance(time.Duration(rng.Int64N(int64(r.Per))))
	if pattern == "edge" {
		// Just before a tick's end: where halving gives back half the
		// burst at once.
		compile := r.Compile
		if halving {
			compile = r.CompileHalving
		}
		l, err := compile()
		if err != nil {
			t.Fatal(err)
		}
		ns, tick := clk.Now().UnixNano(), int64(l.Tick)
		clk.Advance(time.Duration(tick - ns%tick - int64(r.Per)/1000))
	}
	var sc Scratch
	facts := [1]Fact{{Rule: s.Rules[0], Key: "k"}}
	fine := r.Per / time.Duration(200*r.Requests) // far faster than the limit
	for at := time.Duration(0); at < 12*r.Per; {
		sc.Reset()
		d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts[:]}, &sc)
		d.Done()
		if d.Admitted {
			ts = append(ts, at)
		} else {
			refused++
		}
		step := fine
		if pattern == "edge" && at == 0 && len(ts)+refused <= int(max(r.Burst, r.Requests)) {
			step = 0 // the whole burst at once, just before the tick's end
		}
		if pattern == "bursts" && rng.IntN(8) == 0 {
			step = time.Duration(rng.Int64N(int64(r.Per)))
		}
		at += step
		clk.Advance(step)
	}
	slices.Sort(ts)
	return ts, refused
}

// TestWindowFigures measures, for halving and for smooth decay, the most a
// key is admitted beyond its burst in any window of Per and of a tenth of
// it (in Requests: the window bound's e), over 8 phases and three patterns
// (a request every Per/(200 · Requests) from a random phase, the same from
// just before a tick's end, and bursts at random instants).
// It asserts what docs/DESIGN.md, Smooth decay, states: smooth decay keeps
// a tenth of Per within a tenth of the limit and a sixteenth of the burst,
// where halving gives half the burst there. With EPOCHSKETCH_FIGURES=1 it
// prints THEORY.md's table (section 9).
func TestWindowFigures(t *testing.T) {
	limits := []rate.Rate{
		{Requests: 1, Per: time.Minute},
		{Requests: 7, Per: time.Second},
		{Requests: 100, Per: time.Minute},
		{Requests: 100, Per: time.Minute, Burst: 25},
		{Requests: 10, Per: time.Minute, Burst: 50},
	}
	var table strings.Builder
	table.WriteString("| limit | decay | most beyond the burst in Per/10 | in Per | overload rate |\n|---|---|--:|--:|--:|\n")
	for _, r := range limits {
		burst := r.Burst
		if burst == 0 {
			burst = r.Requests
		}
		for _, halving := range []bool{true, false} {
			var tenth, whole float64
			for seed := range uint64(8) {
				for _, p := range []string{"flood", "edge", "bursts"} {
					ts, refused := windowRun(t, halving, r, p, seed)
					if len(ts) == 0 || p != "bursts" && refused == 0 {
						t.Fatalf("%+v: %d admitted, %d refused: the limit did not run", r, len(ts), refused)
					}
					tenth = max(tenth, (float64(testkit.MaxInWindow(ts, r.Per/10))-burst)/r.Requests)
					whole = max(whole, (float64(testkit.MaxInWindow(ts, r.Per))-burst)/r.Requests)
				}
			}
			ts, _ := windowRun(t, halving, r, "flood", 99)
			over := float64(len(ts)-testkit.MaxInWindow(ts, 2*r.Per)) / 10 / r.Requests // after the first two periods
			name := "smooth"
			if halving {
				name = "halving"
			}
			fmt.Fprintf(&table, "| %g per %v, burst %g | %s | %.2f | %.2f | %.3f |\n", r.Requests, r.Per, burst, name, tenth, whole, over)
			if !halving && (tenth > 0.1*1.05+burst/16/r.Requests+1/r.Requests || whole > 1.05+burst/16/r.Requests+1/r.Requests) {
				t.Errorf("%+v, smooth: %.2f and %.2f of Requests beyond the burst in Per/10 and Per", r, tenth, whole)
			}
		}
	}
	if os.Getenv("EPOCHSKETCH_FIGURES") != "" {
		t.Log("\n" + table.String())
	}
}
