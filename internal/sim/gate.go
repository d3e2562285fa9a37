package sim

import (
	"fmt"
	"math"

	"github.com/epochsketch/epochsketch/internal/lab"
)

// Workload is an adversarial stream for the decision gate: it drives a
// sketch and an oracle of the keys that matter, and returns the final tick.
type Workload struct {
	Name string
	Run  func(sk *ES, o *Oracle, seed uint64, scale int) (heavy []string, end int64)
}

// GateBuckets sizes the decision gate's sketch: 64 buckets, 512 slots (4 KiB),
// so that the 100 heavy keys, the weakest of them at 5 per tick, are under
// real pressure from the mice and both lotteries chip them.
const GateBuckets = 64

// GateWorkloads are the adversarial streams of section 1, at a size that runs
// in seconds. Each drives 1,000 contending keys at skewed rates (1 + 400/(i+1)
// per tick: 401, 201, 134, ... down to 1) into the 512 slots, plus the
// workload's own adversary; the evaluated keys are the true top 100 by exact
// count at the last tick. scale multiplies the adversary's traffic.
var GateWorkloads = []Workload{
	{"mouse-flood", func(sk *ES, o *Oracle, seed uint64, scale int) ([]string, int64) {
		// 2,000×scale one-hit mice per tick: 4 per slot per tick.
		keys := contenders(seed, "k")
		mouse := 0
		const ticks = 12
		for tick := int64(0); tick < ticks; tick++ {
			for i, k := range keys {
				drive(sk, o, k, tick, rate(i))
				for range 2 * scale {
					sk.Observe(Key(fmt.Sprintf("s%d-m", seed), mouse), tick)
					mouse++
				}
			}
		}
		return topKeys(o, ticks-1), ticks - 1
	}},
	{"churn", func(sk *ES, o *Oracle, seed uint64, scale int) ([]string, int64) {
		// The contenders' ranks rotate every 4 ticks (a shifting hotspot),
		// over a Zipf(1.0) background of 50,000 keys at 1,000×scale per tick.
		keys := contenders(seed, "k")
		z := NewZipf(50_000, 1.0, seed)
		const ticks = 16
		for tick := int64(0); tick < ticks; tick++ {
			shift := int(tick/4) * 250
			for i := range keys {
				drive(sk, o, keys[(i+shift)%len(keys)], tick, rate(i))
				for range scale {
					sk.Observe(Key(fmt.Sprintf("s%d-bg", seed), z.Next()), tick)
				}
			}
		}
		return topKeys(o, ticks-1), ticks - 1
	}},
	{"rotating-challengers", func(sk *ES, o *Oracle, seed uint64, scale int) ([]string, int64) {
		// Low-cardinality rotating challengers: 16×scale keys at 60 per tick,
		// replaced by fresh ones every 2 ticks (a slow key rotation).
		keys := contenders(seed, "k")
		const ticks = 12
		for tick := int64(0); tick < ticks; tick++ {
			for i, k := range keys {
				drive(sk, o, k, tick, rate(i))
			}
			for c := range 16 * scale {
				k := fmt.Sprintf("s%d-rot%d-%d", seed, tick/2, c)
				for range 60 {
					sk.Observe(k, tick)
				}
			}
		}
		return topKeys(o, ticks-1), ticks - 1
	}},
	{"bucket-flood", func(sk *ES, o *Oracle, seed uint64, scale int) ([]string, int64) {
		// An attacker who knows the seed aims 200×scale keys at the buckets
		// of the 50 heaviest contenders, each key 12 times per tick: counts
		// of about 23, pressing the lottery where it matters.
		end := aimedFlood(sk, sk, o, seed, 200*scale)
		return topKeys(o, end), end
	}},
}

// aimedFlood drives the 1,000 contenders for 12 ticks while n attack keys,
// 12 arrivals per tick each, hit the buckets of the 50 heaviest contenders as
// aim (the sketch itself, or the attacker's copy with its own seed) computes
// them. It returns the last tick.
func aimedFlood(sk, aim *ES, o *Oracle, seed uint64, n int) int64 {
	keys := contenders(seed, "k")
	targets := map[int]bool{}
	for _, k := range keys[:50] {
		b, _, _ := lab.Locate(aim.Sk, k)
		targets[b] = true
	}
	var attack []string
	for i := 0; len(attack) < n; i++ {
		k := Key(fmt.Sprintf("s%d-atk", seed), i)
		if b, _, _ := lab.Locate(aim.Sk, k); targets[b] {
			attack = append(attack, k)
		}
	}
	const ticks = 12
	for tick := int64(0); tick < ticks; tick++ {
		for i, k := range keys {
			drive(sk, o, k, tick, rate(i))
		}
		for _, k := range attack {
			for range 12 {
				sk.Observe(k, tick)
			}
		}
	}
	return ticks - 1
}

func contenders(seed uint64, prefix string) []string {
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = Key(fmt.Sprintf("s%d-%s", seed, prefix), i)
	}
	return keys
}

func rate(i int) int { return 1 + 400/(i+1) }

func drive(sk *ES, o *Oracle, k string, tick int64, n int) {
	for range n {
		sk.Observe(k, tick)
		o.Observe(k, tick)
	}
}

// topKeys returns the true top 500 at tick, heaviest first: the top 100 are
// the heavy hitters; ranks 101-500 are the tail where the lottery acts.
func topKeys(o *Oracle, tick int64) []string {
	var out []string
	for _, kv := range o.Top(500, tick) {
		out = append(out, kv.Key)
	}
	return out
}

// GateErrors runs workload w on seeds 1..seeds with lottery lot and returns
// the relative error (estimate - exact) / exact of the true top 100 and of
// ranks 101-500 at the end, each pooled over seeds.
func GateErrors(w Workload, lot Lottery, seeds, scale int) (top, tail []float64) {
	out := make([][]float64, seeds)
	tails := make([][]float64, seeds)
	parallelFor(seeds, func(i int) {
		seed := uint64(i + 1)
		sk := NewES(GateBuckets, lot, false, seed)
		o := NewOracle()
		ranked, end := w.Run(sk, o, seed, scale)
		for r, k := range ranked {
			exact := float64(o.At(k, end))
			if exact == 0 {
				continue
			}
			e := (float64(sk.Estimate(k, end)) - exact) / exact
			if r < 100 {
				out[i] = append(out[i], e)
			} else {
				tails[i] = append(tails[i], e)
			}
		}
	})
	for i := range out {
		top = append(top, out[i]...)
		tail = append(tail, tails[i]...)
	}
	return top, tail
}

// LibraryDuel is Duel on the real library: one bucket filled by 8 occupants
// inserted n times at tick 0, a challenger arriving r times per tick; it
// returns the challenger's arrivals until admitted (capped).
func LibraryDuel(lot Lottery, n, r, maxTicks int, seed uint64) DuelResult {
	sk := NewES(1, lot, false, seed)
	var occ []string
	tags := map[uint16]bool{}
	for i := 0; len(occ) < 8; i++ {
		k := fmt.Sprintf("s%d-occ%d", seed, i)
		if _, _, tag := lab.Locate(sk.Sk, k); !tags[tag] {
			tags[tag] = true
			occ = append(occ, k)
		}
	}
	for _, k := range occ {
		for range n {
			sk.Observe(k, 0)
		}
	}
	ch := ""
	for i := 0; ch == ""; i++ {
		if _, _, tag := lab.Locate(sk.Sk, fmt.Sprintf("s%d-ch%d", seed, i)); !tags[tag] {
			ch = fmt.Sprintf("s%d-ch%d", seed, i)
		}
	}
	arrivals := 0
	for tick := int64(0); tick < int64(maxTicks); tick++ {
		for range r {
			arrivals++
			sk.Observe(ch, tick)
			if sk.Estimate(ch, tick) > 0 {
				return DuelResult{arrivals, int(tick)}
			}
		}
	}
	return DuelResult{arrivals, maxTicks}
}

// GateRow is one comparison of the decision gate.
type GateRow struct {
	Workload           string
	N                  [2]int
	P10                [2]float64
	MeanAbs, NonZero   [2]float64
	KSD, KSP, ADT, ADP float64
}

// Compare summarizes two samples (chip, heavykeeper) with both tests.
func Compare(name string, a, b []float64) GateRow {
	r := GateRow{Workload: name, N: [2]int{len(a), len(b)}}
	r.P10 = [2]float64{Quantile(a, 0.1), Quantile(b, 0.1)}
	for i, s := range [][]float64{a, b} {
		for _, v := range s {
			r.MeanAbs[i] += math.Abs(v) / float64(len(s))
			if v != 0 {
				r.NonZero[i] += 1 / float64(len(s))
			}
		}
	}
	r.KSD, r.KSP = KS2(a, b)
	r.ADT, r.ADP = AD2(a, b)
	if math.IsNaN(r.ADT) { // identical constant samples
		r.ADT, r.ADP = 0, 1
	}
	return r
}
