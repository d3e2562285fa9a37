package sim

import (
	"fmt"
	"io"
	"math"

	"github.com/epochsketch/epochsketch/internal/lab"
)

// runWeighted is section 9: the lottery for weighted Observes (ObserveN),
// which SketchProxy's wallets use. A full bucket of 8 residents at count C
// meets one newcomer with weight w: how many counts do the residents lose,
// and how often is the newcomer admitted? The draws are capped at 64 per
// call (bounded work); below the cap a weighted call is exactly w unit calls.
func runWeighted(o Options, w io.Writer) error {
	trials := 4000
	if o.Quick {
		trials = 300
	}
	counts := []uint32{5, 20, 50, 100, 200}
	weights := []uint32{1, 10, 64, 1000, 1_000_000}
	fmt.Fprintf(w, "One bucket of 8 residents at count C (HeavyKeeper lottery), one newcomer ObserveN(t, key, w); %d trials per cell, fresh seeds.\n", trials)
	fmt.Fprintln(w, "Each cell: counts taken from the residents per call (measured / analysis), and the share of calls that admitted the newcomer.")
	fmt.Fprintln(w)
	head := []string{"C"}
	for _, wt := range weights {
		head = append(head, fmt.Sprintf("w = %d", wt))
	}
	rows := [][]string{head}
	skipped, total := 0, 0
	for _, c := range counts {
		row := []string{fmt.Sprint(c)}
		for _, wt := range weights {
			lost := make([]float64, trials)
			in := make([]float64, trials)
			ok := make([]bool, trials)
			parallelFor(trials, func(i int) {
				es := NewES(1, HeavyKeeper, false, uint64(i+1)*7919+uint64(c)*31+uint64(wt))
				// Keys sharing a fingerprint share a slot (section 3): that is
				// not the lottery, so such trials are left out and counted.
				tags := map[uint16]bool{}
				for _, k := range []string{"resident0", "resident1", "resident2", "resident3", "resident4", "resident5", "resident6", "resident7", "newcomer"} {
					_, _, tag := lab.Locate(es.Sk, k)
					tags[tag] = true
				}
				if ok[i] = len(tags) == 9; !ok[i] {
					return
				}
				for r := range 8 {
					es.Sk.ObserveN(at(0), fmt.Sprint("resident", r), c)
				}
				before := 0
				for r := range 8 {
					before += int(es.Estimate(fmt.Sprint("resident", r), 0))
				}
				es.Sk.ObserveN(at(0), "newcomer", wt)
				after := 0
				for r := range 8 {
					after += int(es.Estimate(fmt.Sprint("resident", r), 0))
				}
				lost[i] = float64(before - after)
				if es.Estimate("newcomer", 0) > 0 {
					in[i] = 1
				}
			})
			var l, n []float64
			for i := range trials {
				if ok[i] {
					l, n = append(l, lost[i]), append(n, in[i])
				} else {
					skipped++
				}
			}
			total += trials
			row = append(row, fmt.Sprintf("%s / %s, in %.1f%%", fmtLoss(Mean(l)), fmtLoss(expectedWins(c, wt)), 100*Mean(n)))
		}
		rows = append(rows, row)
	}
	table(w, rows)
	fmt.Fprintf(w, "Trials left out because two of the 9 keys shared a fingerprint: %d of %d (%.3f%%).\n\n", skipped, total, 100*float64(skipped)/float64(total))
	return nil
}

// expectedWins is the analysis: the expected counts taken by min(w, 64)
// HeavyKeeper draws against a victim at count c, each win lowering the next
// draw's count by one, stopping at 0 (a dynamic program over the wins).
func expectedWins(c, w uint32) float64 {
	draws := int(min(w, 64))
	p := make([]float64, int(c)+1) // p[k]: probability of k wins so far
	p[0] = 1
	for range draws {
		next := make([]float64, len(p))
		for k, pk := range p {
			if pk == 0 {
				continue
			}
			if k == int(c) {
				next[k] += pk
				continue
			}
			q := math.Pow(1.08, -float64(int(c)-k))
			next[k+1] += pk * q
			next[k] += pk * (1 - q)
		}
		p = next
	}
	e := 0.0
	for k, pk := range p {
		e += float64(k) * pk
	}
	return e
}

func fmtLoss(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v < 0.001:
		return fmt.Sprintf("%.1e", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}
