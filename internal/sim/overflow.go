package sim

import (
	"fmt"
	"io"
	"math"

	"github.com/epochsketch/epochsketch/internal/lab"
)

// runOverflow is section 2: how often a bucket receives more heavy hitters
// than its 8 slots at the sizing rule's safety factors, measured by hashing
// real keys with the library, against the Poisson prediction, and the recall
// of the heavy set once they compete (one bucket, and the two-bucket escape
// hatch).
func runOverflow(o Options, w io.Writer) error {
	k, seeds, lo, span, mice := 2000, o.seeds(), 20, 381, 10 // concurrent heavy hitters, rates lo..lo+span-1
	if o.Quick {
		k, seeds, lo, span, mice = 400, 2, 4, 20, 2
	}
	fmt.Fprintf(w, "%d heavy hitters, each at %d to %d per tick, over a background of %d one-hit mice per tick; %d seeds per row.\n", k, lo, lo+span-1, k*mice, seeds)
	fmt.Fprintf(w, "Overflow: share of buckets that the %d heavy keys, hashed by the library, fill past 8 (Poisson: the analytic tail).\n", k)
	fmt.Fprintln(w, "Recall: share of the heavy keys whose estimate is within 10% of the exact decayed count after 8 ticks.")
	fmt.Fprintln(w)
	rows := [][]string{{"safety factor", "buckets", "mean heavy per bucket", "overflow measured", "overflow Poisson", "recall, one bucket", "recall, two buckets"}}
	for _, f := range []int{1, 2, 4, 8} {
		buckets := (k*f + 7) / 8
		over := make([]float64, seeds)
		rec := [2][]float64{make([]float64, seeds), make([]float64, seeds)}
		parallelFor(seeds, func(i int) {
			seed := uint64(i + 1)
			for two := 0; two < 2; two++ {
				sk := NewES(buckets, HeavyKeeper, two == 1, seed)
				keys := make([]string, k)
				perBucket := make([]int, buckets)
				for j := range keys {
					keys[j] = Key(fmt.Sprintf("s%d-h", seed), j)
					b, _, _ := lab.Locate(sk.Sk, keys[j])
					perBucket[b]++
				}
				if two == 0 {
					n := 0
					for _, c := range perBucket {
						if c > 8 {
							n++
						}
					}
					over[i] = float64(n) / float64(buckets)
				}
				orc := NewOracle()
				mouse := 0
				const ticks = 8
				for tick := int64(0); tick < ticks; tick++ {
					for j, key := range keys {
						drive(sk, orc, key, tick, lo+j%span)
						for range mice {
							sk.Observe(Key(fmt.Sprintf("s%d-m", seed), mouse), tick)
							mouse++
						}
					}
				}
				rec[two][i] = float64(within10(sk, orc, keys, ticks-1)) / float64(k)
			}
		})
		lambda := float64(k) / float64(buckets)
		rows = append(rows, []string{fmt.Sprint(f), fmt.Sprint(buckets), fmt.Sprintf("%.2f", lambda),
			fmt.Sprintf("%.4f", Mean(over)), fmt.Sprintf("%.4f", poissonTail(lambda, 8)),
			fmt.Sprintf("%.4f", Mean(rec[0])), fmt.Sprintf("%.4f", Mean(rec[1]))})
	}
	table(w, rows)
	return overflowChurn(o, w)
}

// within10 counts the keys whose estimate at tick is within 10% of the
// exact decayed count: section 2's recall.
func within10(sk *ES, orc *Oracle, keys []string, tick int64) int {
	good := 0
	for _, key := range keys {
		exact := float64(orc.At(key, tick))
		if math.Abs(float64(sk.Estimate(key, tick))-exact) <= 0.1*exact {
			good++
		}
	}
	return good
}

// overflowChurn is section 2 under churn: half of the heavy set is replaced
// every 2 ticks, so departing heavy keys (decaying) and arriving ones
// (growing) hold slots at the same time: the concurrent heavy hitters exceed
// the nominal count, which is what the safety factor must absorb.
func overflowChurn(o Options, w io.Writer) error {
	k, seeds, lo, span := 2000, o.seeds(), 20, 381
	if o.Quick {
		k, seeds, lo, span = 400, 2, 4, 20
	}
	fmt.Fprintf(w, "Under churn: %d heavy hitters at %d to %d per tick, half of them replaced by fresh keys every 2 ticks, 10 ticks; recall of the heavy set live at the end (within 10%%), %d seeds.\n\n", k, lo, lo+span-1, seeds)
	rows := [][]string{{"safety factor", "buckets", "recall, one bucket", "recall, two buckets"}}
	for _, f := range []int{2, 4, 8} {
		buckets := (k*f + 7) / 8
		rec := [2][]float64{make([]float64, seeds), make([]float64, seeds)}
		parallelFor(seeds, func(i int) {
			seed := uint64(i + 1)
			for two := 0; two < 2; two++ {
				sk := NewES(buckets, HeavyKeeper, two == 1, seed)
				orc := NewOracle()
				const ticks = 10
				var live []string
				for tick := int64(0); tick < ticks; tick++ {
					gen := tick / 2
					live = live[:0]
					for j := range k {
						// Even ranks rotate every 2 ticks; odd ranks stay.
						g := int64(0)
						if j%2 == 0 {
							g = gen
						}
						key := fmt.Sprintf("s%d-g%d-h%d", seed, g, j)
						live = append(live, key)
						drive(sk, orc, key, tick, lo+j%span)
					}
				}
				rec[two][i] = float64(within10(sk, orc, live, ticks-1)) / float64(k)
			}
		})
		rows = append(rows, []string{fmt.Sprint(f), fmt.Sprint(buckets), fmt.Sprintf("%.4f", Mean(rec[0])), fmt.Sprintf("%.4f", Mean(rec[1]))})
	}
	table(w, rows)
	return nil
}

// poissonTail is P(X > n) for X ~ Poisson(lambda).
func poissonTail(lambda float64, n int) float64 {
	p, cdf := math.Exp(-lambda), 0.0
	for i := 0; i <= n; i++ {
		cdf += p
		p *= lambda / float64(i+1)
	}
	return max(1-cdf, 0)
}
