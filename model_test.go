package epochsketch_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/lab"
	"github.com/epochsketch/epochsketch/internal/refmodel"
)

// replay drives the sketch and the reference model with the program in ops
// and fails on the first difference in an answer, a slot word or a counter.
//
// Each op is 2 bytes: the first picks the action, the second its argument.
// Keys come from a small universe so that buckets fill, chips happen and
// fingerprints collide; clock moves include whole-wrap jumps and moves back.
func replay(t *testing.T, seed uint64, buckets int, two bool, lot lottery, ops []byte) {
	t.Helper()
	clk := epochsketch.NewManualClock(t0)
	sk := epochsketch.New(epochsketch.Config{
		NumBuckets: buckets, Seed: seed, Clock: clk, TwoChoice: two,
		TickDuration: time.Second,
	})
	if lot == chip {
		lab.UseChip(sk)
	}
	m := refmodel.New(buckets, epochsketch.TickOf(t0.UnixNano(), int64(time.Second)))
	m.TwoChoice = two
	m.HeavyKeep = lot == heavyKeeper
	m.SaltBase = epochsketch.Splitmix(epochsketch.Splitmix(epochsketch.Splitmix(seed)))

	tick := func() int64 { return epochsketch.TickOf(clk.Now().UnixNano(), int64(time.Second)) }
	for i := 0; i+1 < len(ops); i += 2 {
		op, arg := ops[i], int(ops[i+1])
		// Skewed: most ops hit a hot set of about 6 keys per bucket, so
		// residents build counts past the lottery's first mask step (9).
		k := arg % (buckets * 12)
		if arg < 200 {
			k = arg % (buckets * 6)
		}
		key := fmt.Sprint("key", k)
		var what string
		switch op % 16 {
		case 8:
			// Weights: 0 reads, 70 and more pass the 64-draw bound, 1<<25
			// saturates.
			wt := []uint32{0, 2, 3, 9, 40, 70, 1000, 1 << 25}[op>>4%8]
			what = fmt.Sprintf("ObserveN %s %d", key, wt)
			ge, gf := sk.ObserveN(time.Time{}, key, wt)
			var we uint32
			var wf bool
			if wt == 0 {
				we = m.Estimate(sk.HashString(key), tick())
			} else {
				we, wf = m.ObserveN(sk.HashString(key), tick(), wt)
			}
			if ge != we || gf != wf {
				t.Fatalf("op %d %s: sketch (%d, %v), model (%d, %v)", i/2, what, ge, gf, we, wf)
			}
		case 0, 1, 2, 3, 4, 5, 6, 7:
			what = "Observe " + key
			ge, gf := sk.Observe(key)
			we, wf := m.Observe(sk.HashString(key), tick())
			if ge != we || gf != wf {
				t.Fatalf("op %d %s: sketch (%d, %v), model (%d, %v)", i/2, what, ge, gf, we, wf)
			}
		case 9:
			what = "ObserveBytes " + key
			ge, gf := sk.ObserveBytes([]byte(key))
			we, wf := m.Observe(sk.HashString(key), tick())
			if ge != we || gf != wf {
				t.Fatalf("op %d %s: sketch (%d, %v), model (%d, %v)", i/2, what, ge, gf, we, wf)
			}
		case 10, 11:
			what = "Estimate " + key
			if g, w := sk.Estimate(key), m.Estimate(sk.HashString(key), tick()); g != w {
				t.Fatalf("op %d %s: sketch %d, model %d", i/2, what, g, w)
			}
		case 12:
			clk.Advance(time.Duration(arg%8) * time.Second)
		case 13:
			clk.Advance(time.Duration(arg%40) * time.Second)
		case 14:
			// A clock stepped back; the sketch keeps its latest tick.
			clk.Advance(-time.Duration(arg%50) * time.Second)
		case 15:
			// Whole wraps and near-wraps of the 24-bit epoch.
			clk.Advance(time.Duration((1<<24)*(1+arg%2)-arg%30) * time.Second)
		}
		for b := range buckets {
			for j := range epochsketch.SlotsPerBucket {
				if g, w := sk.Word(b, j), m.B[b][j].Word(); g != w {
					t.Fatalf("after op %d (%s): bucket %d slot %d: sketch %#016x, model %#016x", i/2, what, b, j, g, w)
				}
			}
		}
		st := sk.Stats()
		got := [5]uint64{st.CASRetriesExhausted, st.Evictions, st.Chips, st.ScrubbedZombies, st.ChallengesLost}
		if got != m.Stats {
			t.Fatalf("after op %d (%s): stats %v, model %v", i/2, what, got, m.Stats)
		}
	}
}

// FuzzModel demands that the fast code and the reference model agree word for
// word. go test -fuzz=FuzzModel explores; the seed corpus runs in every test.
func FuzzModel(f *testing.F) {
	f.Add(uint64(1), uint8(1), false, false, []byte{0, 1, 0, 1, 0, 2, 12, 1, 0, 1, 10, 1})
	f.Add(uint64(7), uint8(2), true, false, []byte{0, 9, 1, 10, 2, 11, 15, 3, 0, 9, 13, 30, 14, 40, 0, 9})
	f.Add(uint64(3), uint8(1), false, true, []byte{0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 0, 9, 0, 10})
	f.Fuzz(func(t *testing.T, seed uint64, nb uint8, two, hk bool, ops []byte) {
		if seed == 0 {
			seed = 1
		}
		lot := chip
		if hk {
			lot = heavyKeeper
		}
		replay(t, seed, 1+int(nb%4), two, lot, ops)
	})
}

// TestModelRandomPrograms runs long pseudo-random programs through the same
// check, over many seeds and every mode, so the default test run covers far
// more than the fuzz seed corpus.
func TestModelRandomPrograms(t *testing.T) {
	n := 4000
	if testing.Short() {
		n = 800
	}
	for seed := uint64(1); seed <= 24; seed++ {
		for _, two := range []bool{false, true} {
			for _, lot := range lotteries {
				t.Run(fmt.Sprintf("seed=%d/two=%v/%v", seed, two, lot), func(t *testing.T) {
					ops := make([]byte, 2*n)
					x := seed
					for i := range ops {
						x = refmodel.Splitmix64(x)
						ops[i] = byte(x)
						if i%2 == 0 && ops[i]%16 >= 12 && x>>20%4 != 0 {
							ops[i] %= 9 // keep clock moves to about 1 op in 16
						}
					}
					replay(t, seed, 1+int(seed%3), two, lot, ops)
				})
			}
		}
	}
}
