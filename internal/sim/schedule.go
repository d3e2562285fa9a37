package sim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/epochsketch/epochsketch/internal/plot"
)

// Schedule is a chip lottery: the probability that one challenge chips a
// victim whose effective count is c.
type Schedule struct {
	Name string
	Note string
	P    func(c uint32) float64
}

// Schedules are the candidates of THEORY.md section 1. M-schedules draw k
// mask bits, P = 2^-k(c), so they need no float math on the hot path;
// HeavyKeeper draws against b^-C.
var Schedules = []Schedule{
	{"M1", "k = C: the plain example (3 counts: 1 in 8)", func(c uint32) float64 { return math.Ldexp(1, -int(min(c, 1100))) }},
	{"M2", "k = floor(log2(C+1)): P ≈ 1/(C+1)", func(c uint32) float64 { return math.Ldexp(1, -int(math.Floor(math.Log2(float64(c)+1)))) }},
	{"M3", "k = floor(C/9): 2^(1/9) = 1.080, HeavyKeeper's base in steps (the retired chip lottery's schedule)", func(c uint32) float64 { return math.Ldexp(1, -int(c/9)) }},
	{"M4", "k = floor(C/4): base 1.19", func(c uint32) float64 { return math.Ldexp(1, -int(c/4)) }},
	{"HK", "HeavyKeeper, exact 1.08^-C", func(c uint32) float64 { return math.Pow(1.08, -float64(c)) }},
	{"HK-C++", "HeavyKeeper as the authors' C++ computes it: 1/floor(1.08^C)", func(c uint32) float64 { return 1 / math.Floor(math.Pow(1.08, float64(c))) }},
}

// DuelResult is one duel: how long a challenger waited for a slot.
type DuelResult struct {
	Arrivals int // challenger arrivals until it held a slot
	Ticks    int // ticks until then
}

// Duel simulates a challenger against a full bucket with a schedule, exactly as the library
// resolves a full bucket: 8 occupants inserted n times at tick 0, then idle
// (decaying by half per tick); one challenger arriving r times per tick from
// tick 0. Each arrival challenges the weakest occupant; a win takes one count
// at the occupant's current decayed value, and a win on a count of 1 (or a
// decayed-to-zero occupant) admits the challenger. Capped at maxTicks.
func Duel(s Schedule, n, r, maxTicks int, seed uint64) DuelResult {
	rng := rand.New(rand.NewPCG(seed, 0xd0e1))
	var count [8]uint64 // stored counts, all written at tick 0
	for i := range count {
		count[i] = uint64(n)
	}
	arrivals := 0
	for tick := 0; tick < maxTicks; tick++ {
		for range r {
			arrivals++
			// The weakest occupant at this tick (the first on a tie).
			w, we := 0, uint64(math.MaxUint64)
			for i, c := range count {
				if e := c >> min(tick, 63); e < we {
					w, we = i, e
				}
			}
			if we == 0 {
				return DuelResult{arrivals, tick}
			}
			if rng.Float64() < s.P(uint32(min(we, 1<<24-1))) {
				if we == 1 {
					return DuelResult{arrivals, tick}
				}
				count[w] -= 1 << min(tick, 63) // one count at this age, epoch kept
			}
		}
	}
	return DuelResult{arrivals, maxTicks}
}

// ProtectionTable renders P(chip | C) per schedule for the counts in cs.
func ProtectionTable(cs []uint32) [][]string {
	head := []string{"schedule"}
	for _, c := range cs {
		head = append(head, fmt.Sprintf("C=%d", c))
	}
	rows := [][]string{head}
	for _, s := range Schedules {
		row := []string{s.Name}
		for _, c := range cs {
			row = append(row, fmtP(s.P(c)))
		}
		rows = append(rows, row)
	}
	return rows
}

func fmtP(p float64) string {
	switch {
	case p == 0 || p < 1e-300:
		return "0"
	case p >= 0.01:
		return fmt.Sprintf("%.3g", p)
	default:
		return fmt.Sprintf("%.1e", p)
	}
}

func runSchedule(o Options, w io.Writer) error {
	fmt.Fprintln(w, "### Protection curves: P(chip) per challenge against a victim of effective count C")
	fmt.Fprintln(w)
	table(w, ProtectionTable([]uint32{1, 3, 8, 9, 20, 50, 100, 200, 576, 1000}))
	for _, s := range Schedules {
		fmt.Fprintf(w, "- **%s**: %s\n", s.Name, s.Note)
	}
	fmt.Fprintln(w)
	if o.Out != "" {
		if err := plotProtection(filepath.Join(o.Out, "protection.svg")); err != nil {
			return err
		}
	}

	// Admission time of a new elephant: the generic duel per schedule.
	seeds := 200
	if o.Quick {
		seeds = 20
	}
	fmt.Fprintf(w, "### Admission time of a new heavy hitter (duel, %d seeds per cell)\n\n", seeds)
	fmt.Fprintln(w, "Eight occupants inserted n times at tick 0, then idle (halving every tick); one")
	fmt.Fprintln(w, "challenger arriving r times per tick. Cells: median / 90th percentile of the tick at")
	fmt.Fprintln(w, "which the challenger holds a slot. The v1 rule (admit only when the weakest occupant")
	fmt.Fprintln(w, "has decayed to 0) waits floor(log2 n)+1 ticks: 4, 7 and 10 for n = 10, 100, 1000.")
	fmt.Fprintln(w)
	type cell struct{ n, r int }
	cells := []cell{{10, 10}, {100, 10}, {100, 1000}, {1000, 100}, {1000, 10000}}
	head := []string{"schedule"}
	for _, c := range cells {
		head = append(head, fmt.Sprintf("n=%d r=%d", c.n, c.r))
	}
	rows := [][]string{head}
	for _, s := range Schedules {
		row := []string{s.Name}
		for _, c := range cells {
			ticks := make([]float64, seeds)
			parallelFor(seeds, func(i int) {
				ticks[i] = float64(Duel(s, c.n, c.r, 40, uint64(i+1)).Ticks)
			})
			row = append(row, fmt.Sprintf("%g / %g", Quantile(ticks, 0.5), Quantile(ticks, 0.9)))
		}
		rows = append(rows, row)
	}
	table(w, rows)

	// The default lottery's test on the real library.
	seeds = o.seeds()
	scale := 1
	fmt.Fprintf(w, "### The default lottery: library chip lottery (M3) against HeavyKeeper-classic, %d seeds per workload\n\n", seeds)
	fmt.Fprintln(w, "Relative error (estimate - exact) / exact of the true top 100 keys at the last tick,")
	fmt.Fprintln(w, "pooled over seeds: a 64-bucket sketch (512 slots, 4 KiB) against 1,000 contending keys")
	fmt.Fprintln(w, "at 1 + 400/(i+1) per tick plus each workload's adversary. Duel: arrivals until a challenger")
	fmt.Fprintln(w, "holds a slot against 8 occupants of count 100 (r = 100 per tick). KS: two-sample")
	fmt.Fprintln(w, "Kolmogorov-Smirnov; AD: Scholz-Stephens Anderson-Darling, p clamped to [0.001, 0.25].")
	fmt.Fprintln(w)
	var gate []GateRow
	for _, wl := range GateWorkloads {
		a, at := GateErrors(wl, Chip, seeds, scale)
		b, bt := GateErrors(wl, HeavyKeeper, seeds, scale)
		gate = append(gate, Compare(wl.Name+", top 100", a, b), Compare(wl.Name+", ranks 101-500", at, bt))
	}
	duel := func(lot Lottery) []float64 {
		out := make([]float64, seeds)
		parallelFor(seeds, func(i int) {
			out[i] = float64(LibraryDuel(lot, 100, 100, 40, uint64(i+1)).Arrivals)
		})
		return out
	}
	gate = append(gate, Compare("duel (arrivals)", duel(Chip), duel(HeavyKeeper)))
	rows = [][]string{{"workload: relative error", "n (chip, hk)", "mean abs chip / hk", "share with error chip / hk", "p10 chip / hk", "KS D", "KS p", "AD T", "AD p"}}
	rejected := 0
	for _, g := range gate {
		rows = append(rows, []string{g.Workload, fmt.Sprintf("%d, %d", g.N[0], g.N[1]),
			fmt.Sprintf("%.4f / %.4f", g.MeanAbs[0], g.MeanAbs[1]), fmt.Sprintf("%.3f / %.3f", g.NonZero[0], g.NonZero[1]),
			fmt.Sprintf("%.4g / %.4g", g.P10[0], g.P10[1]),
			fmt.Sprintf("%.3f", g.KSD), fmt.Sprintf("%.3g", g.KSP), fmt.Sprintf("%.2f", g.ADT), fmt.Sprintf("%.3g", g.ADP)})
		if g.KSP < 0.05/float64(len(gate)) || g.ADP < 0.05/float64(len(gate)) {
			rejected++
		}
	}
	table(w, rows)
	if rejected == 0 {
		fmt.Fprintf(w, "**Verdict**: no test rejects equality at the 5%% level after a Bonferroni correction over %d comparisons (p < %.4f): hash-entropy chipping is statistically indistinguishable from HeavyKeeper-classic on these workloads, so hash-entropy chipping (schedule M3) could be the default.\n\n", len(gate), 0.05/float64(len(gate)))
	} else {
		fmt.Fprintf(w, "**Verdict**: %d of %d comparisons reject equality at the 5%% level after a Bonferroni correction (p < %.4f): the distributions differ. Read the medians above for the direction before choosing the default.\n\n", rejected, len(gate), 0.05/float64(len(gate)))
	}
	return nil
}

// plotProtection writes P(chip | C) on a log scale for every schedule.
func plotProtection(path string) error {
	var series []plot.Series
	for _, s := range Schedules {
		var pts [][2]float64
		for c := uint32(1); c <= 200; c++ {
			if p := s.P(c); p > 1e-12 {
				pts = append(pts, [2]float64{float64(c), math.Log10(p)})
			}
		}
		series = append(series, plot.Series{Name: s.Name, Points: pts})
	}
	return os.WriteFile(path, []byte(plot.LinePlot("P(chip) per challenge", "victim's effective count C", "log10 P", series)), 0o644)
}
