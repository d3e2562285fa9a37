package sim

import (
	"fmt"
	"io"

	"github.com/epochsketch/epochsketch"
)

// runTicks checks the Tick Table (docs/DESIGN.md) by simulation: a sustained rate R per
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
		sk := NewES(16, HeavyKeeper, false, 1)
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
