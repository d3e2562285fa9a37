package sim

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"

	"github.com/epochsketch/epochsketch"
)

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
			if b, _, _ := lab.Locate(sk, k); victims[b] == "" {
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
