package sim

import (
	"fmt"
	"io"
	"math"
	"time"

	"github.com/epochsketch/epochsketch"
)

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
