// Package sim is the simulation harness behind THEORY.md: streams, exact
// oracles, comparators from the literature, statistical tests and the
// experiments of THEORY.md. It imports the standard
// library and the epochsketch package only; `epochsketch sim` runs it.
package sim

import (
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
)

// Zipf samples ranks 0..n-1 with P(r) ∝ (r+1)^-s for any s > 0 (the
// standard library's Zipf needs s > 1), by inverse CDF over a table.
type Zipf struct {
	cdf []float64
	r   *rand.Rand
}

// NewZipf returns a sampler over n ranks with skew s, seeded.
func NewZipf(n int, s float64, seed uint64) *Zipf {
	cdf := make([]float64, n)
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	return &Zipf{cdf: cdf, r: rand.New(rand.NewPCG(seed, 0x21bf))}
}

// Next returns the next rank.
func (z *Zipf) Next() int {
	u := z.r.Float64()
	return sort.SearchFloat64s(z.cdf, u)
}

// Key names rank r of a stream family; distinct prefixes give disjoint
// key spaces.
func Key(prefix string, r int) string { return prefix + strconv.Itoa(r) }
