package sim

import (
	"fmt"
	"io"
)

// runCollisions is section 3: fingerprint collisions. Two keys in one bucket
// with the same 16-bit tag share a slot, so the lighter one reads the
// heavier one's count. Measured: the share of keys whose estimate exceeds the
// exact count, and by how much, on a Zipf(1.1) stream.
func runCollisions(o Options, w io.Writer) error {
	seeds := o.seeds()
	n := 200_000
	if o.Quick {
		n = 50_000
	}
	fmt.Fprintf(w, "Zipf(1.1) over 100,000 keys, %d arrivals in one tick, %d seeds; the oracle is exact.\n", n, seeds)
	fmt.Fprintln(w, "Expectation: a key finds a foreign slot with its tag with probability about (live slots in its bucket)/65,535, at most 8/65,535 = 1.22e-4; the shared slot then holds both keys' counts, so each collision overestimates two keys.")
	fmt.Fprintln(w)
	rows := [][]string{{"buckets", "keys queried", "overestimated", "share", "mean excess of those (counts)", "max excess"}}
	for _, buckets := range []int{256, 4096, 65536} {
		var total, over float64
		var excess []float64
		res := make([][3]float64, seeds)
		exs := make([][]float64, seeds)
		parallelFor(seeds, func(i int) {
			seed := uint64(i + 1)
			sk := NewES(buckets, HeavyKeeper, false, seed)
			orc := NewOracle()
			z := NewZipf(100_000, 1.1, seed)
			for range n {
				k := Key(fmt.Sprintf("s%d-", seed), z.Next())
				sk.Observe(k, 0)
				orc.Observe(k, 0)
			}
			for _, k := range orc.Keys() {
				res[i][0]++
				if d := float64(sk.Estimate(k, 0)) - float64(orc.At(k, 0)); d > 0 {
					res[i][1]++
					exs[i] = append(exs[i], d)
				}
			}
		})
		for i := range res {
			total += res[i][0]
			over += res[i][1]
			excess = append(excess, exs[i]...)
		}
		mean, mx := 0.0, 0.0
		if len(excess) > 0 {
			mean = Mean(excess)
			mx = Quantile(excess, 1)
		}
		rows = append(rows, []string{fmt.Sprint(buckets), fmt.Sprint(int(total)), fmt.Sprint(int(over)),
			fmt.Sprintf("%.2e", over/total), fmt.Sprintf("%.1f", mean), fmt.Sprintf("%g", mx)})
	}
	table(w, rows)
	return nil
}
