package sim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
)

// runMorris is section 5's simulation: a Morris counter with base 2^(1/8),
// whose halving per tick is "subtract 8 from the exponent", against the exact
// integer-decayed count, at sustained rates.
func runMorris(o Options, w io.Writer) error {
	seeds := o.seeds()
	fmt.Fprintf(w, "A key arriving R times per tick for 40 ticks; a Morris exponent e (8 bits, base b = 2^(1/8)) incremented with probability b^-e, decayed by e -= 8 per tick; read as (b^e - 1)/(b - 1). %d seeds per row; the truth is the exact steady state 2R-1.\n\n", seeds)
	rows := [][]string{{"R per tick", "exact 2R-1", "Morris mean", "relative bias", "relative std", "draws per arrival"}}
	const b = 1.0905077326652577 // 2^(1/8)
	rates := []int{10, 100, 1000, 100_000}
	if o.Quick {
		rates = []int{10, 100}
	}
	for _, r := range rates {
		ests := make([]float64, seeds)
		parallelFor(seeds, func(i int) {
			rng := rand.New(rand.NewPCG(uint64(i+1), uint64(r)))
			e := 0
			for tick := 0; tick < 40; tick++ {
				if tick > 0 {
					e = max(e-8, 0)
				}
				for range r {
					if e < 255 && rng.Float64() < math.Pow(b, -float64(e)) {
						e++
					}
				}
			}
			ests[i] = (math.Pow(b, float64(e)) - 1) / (b - 1)
		})
		exact := float64(2*r - 1)
		mean := Mean(ests)
		sd := 0.0
		for _, v := range ests {
			sd += (v - mean) * (v - mean) / float64(len(ests))
		}
		rows = append(rows, []string{fmt.Sprint(r), fmt.Sprint(2*r - 1), fmt.Sprintf("%.0f", mean),
			fmt.Sprintf("%+.3f", (mean-exact)/exact), fmt.Sprintf("%.3f", math.Sqrt(sd)/exact), "1"})
	}
	table(w, rows)
	return nil
}
