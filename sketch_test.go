package epochsketch_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"

	"github.com/epochsketch/epochsketch"
)

// newManual returns a seeded sketch on a ManualClock at t0 with a 1 s tick.
func newManual(t *testing.T, cfg epochsketch.Config) (*epochsketch.Sketch, *epochsketch.ManualClock) {
	t.Helper()
	return newManualLottery(t, cfg, heavyKeeper)
}

// newManualLottery is newManual with the full-bucket challenge lot.
func newManualLottery(t *testing.T, cfg epochsketch.Config, lot lottery) (*epochsketch.Sketch, *epochsketch.ManualClock) {
	t.Helper()
	clk := epochsketch.NewManualClock(t0)
	cfg.Clock = clk
	if cfg.Seed == 0 && cfg.Hash != epochsketch.HashMaphash {
		cfg.Seed = 42
	}
	if cfg.TickDuration == 0 {
		cfg.TickDuration = time.Second
	}
	sk := epochsketch.New(cfg)
	if lot == chip {
		lab.UseChip(sk)
	}
	return sk, clk
}

// slotOf finds the bucket and slot that hold key's tag, or (-1, -1).
func slotOf(sk *epochsketch.Sketch, key string) (int, int) {
	h := sk.HashString(key)
	tag := uint16(h >> 16)
	for _, b := range sk.Buckets(h) {
		for j := range epochsketch.SlotsPerBucket {
			if w := sk.Word(b, j); w != 0 && epochsketch.TagOf(w) == tag {
				return b, j
			}
		}
	}
	return -1, -1
}

// keysInBucket returns n distinct keys that hash to bucket b, with distinct
// tags, avoiding the tags in avoid.
func keysInBucket(sk *epochsketch.Sketch, b, n int, prefix string, avoid map[uint16]bool) []string {
	var out []string
	seen := map[uint16]bool{}
	for k := range avoid {
		seen[k] = true
	}
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s%d", prefix, i)
		h := sk.HashString(k)
		if sk.Buckets(h)[0] != b || seen[uint16(h>>16)] {
			continue
		}
		seen[uint16(h>>16)] = true
		out = append(out, k)
	}
	return out
}

func TestSlotLayout(t *testing.T) {
	w := epochsketch.Pack(0xBEEF, 0xABCDEF, 0x123456)
	if w != 0xBEEF_ABCDEF_123456 {
		t.Fatalf("pack = %#x, want 0xbeefabcdef123456", w)
	}
	if epochsketch.TagOf(w) != 0xBEEF || epochsketch.EpochOf(w) != 0xABCDEF || epochsketch.CountOf(w) != 0x123456 {
		t.Fatalf("unpack(%#x) = %#x %#x %#x", w, epochsketch.TagOf(w), epochsketch.EpochOf(w), epochsketch.CountOf(w))
	}
	if epochsketch.BucketSize != 64 || epochsketch.SlotsPerBucket != 8 {
		t.Fatalf("bucket = %d bytes of %d slots, want one 64-byte cache line of 8", epochsketch.BucketSize, epochsketch.SlotsPerBucket)
	}
}

// Padding is computed, never counted by hand; these sizes are what it buys.
func TestStructSizes(t *testing.T) {
	for _, c := range []struct {
		name string
		size uintptr
	}{{"statShard", epochsketch.StatShard}, {"clockState", epochsketch.ClockSize}, {"saltState", epochsketch.SaltSize}} {
		if c.size%epochsketch.CacheLine != 0 {
			t.Errorf("%s is %d bytes, not a whole number of %d-byte lines", c.name, c.size, epochsketch.CacheLine)
		}
	}
}

func TestTableAligned(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7, 100, 1000, 4097} {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: n})
		if a := sk.TableAddr(); a%epochsketch.CacheLine != 0 {
			t.Errorf("NumBuckets=%d: table at %#x is not cache-line aligned", n, a)
		}
		if sk.NumBuckets() != n {
			t.Errorf("NumBuckets() = %d, want %d", sk.NumBuckets(), n)
		}
	}
}

func TestDecayInterpretedAtRead(t *testing.T) {
	// Tick 10 of the Unix-anchored clock is epoch 10.
	clk := epochsketch.NewManualClock(time.Unix(10, 0))
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, Clock: clk, Seed: 1})
	for range 16 {
		sk.Observe("k")
	}
	b, j := slotOf(sk, "k")
	if w := sk.Word(b, j); epochsketch.EpochOf(w) != 10 || epochsketch.CountOf(w) != 16 {
		t.Fatalf("slot = epoch %d count %d, want epoch 10 count 16", epochsketch.EpochOf(w), epochsketch.CountOf(w))
	}
	clk.Advance(999 * time.Millisecond)
	if got := sk.Estimate("k"); got != 16 {
		t.Errorf("a partial tick decayed: Estimate = %d, want 16", got)
	}
	clk.Set(time.Unix(12, 0))
	if got := sk.Estimate("k"); got != 4 {
		t.Errorf("16 at epoch 10 reads %d at epoch 12, want 4", got)
	}
	if w := sk.Word(b, j); epochsketch.CountOf(w) != 16 || epochsketch.EpochOf(w) != 10 {
		t.Errorf("reading changed the slot: %#x", w)
	}

	// The largest count evaporates after exactly 24 silent ticks.
	sk.SetWord(b, j, epochsketch.Pack(epochsketch.TagOf(sk.Word(b, j)), 12, epochsketch.CountMax))
	for age, want := range map[int64]uint32{0: epochsketch.CountMax, 1: epochsketch.CountMax >> 1, 23: 1, 24: 0, 25: 0, 63: 0, 64: 0, 1000: 0} {
		clk.Set(time.Unix(12+age, 0))
		if got := sk.EstimateAt(time.Unix(12+age, 0), "k"); got != want {
			t.Errorf("max count at age %d reads %d, want %d", age, got, want)
		}
		if got := sk.EstimateBytesAt(time.Unix(12+age, 0), []byte("k")); got != want {
			t.Errorf("max count at age %d reads %d through EstimateBytesAt, want %d", age, got, want)
		}
	}
}

func TestDecayClamp(t *testing.T) {
	for _, c := range []struct{ count, age, want uint32 }{
		{16, 2, 4}, {16, 4, 1}, {16, 5, 0}, {epochsketch.CountMax, 23, 1}, {epochsketch.CountMax, 24, 0},
		{epochsketch.CountMax, 63, 0}, {epochsketch.CountMax, 64, 0}, {epochsketch.CountMax, 1 << 23, 0},
	} {
		if got := epochsketch.Decay(c.count, c.age); got != c.want {
			t.Errorf("decay(%d, %d) = %d, want %d", c.count, c.age, got, c.want)
		}
	}
}

func TestSaturatingAdd(t *testing.T) {
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64})
	sk.Observe("elephant")
	b, j := slotOf(sk, "elephant")
	w := sk.Word(b, j)
	sk.SetWord(b, j, w&^uint64(epochsketch.CountMax)|uint64(epochsketch.CountMax-1))
	for i, want := range []uint32{epochsketch.CountMax, epochsketch.CountMax, epochsketch.CountMax} {
		if got, first := sk.Observe("elephant"); got != want || first {
			t.Fatalf("observe %d at the ceiling = (%d, %v), want (%d, false)", i, got, first, want)
		}
	}
	if got := epochsketch.CountOf(sk.Word(b, j)); got != epochsketch.CountMax {
		t.Fatalf("count wrapped to %d", got)
	}
	clk.Advance(time.Second)
	if got := sk.Estimate("elephant"); got != epochsketch.CountMax>>1 {
		t.Errorf("a parked count decays normally: got %d, want %d", got, epochsketch.CountMax>>1)
	}
	if got, first := sk.Observe("elephant"); got != epochsketch.CountMax>>1+1 || !first {
		t.Errorf("after a tick: (%d, %v), want (%d, true)", got, first, epochsketch.CountMax>>1+1)
	}
}

// The first-sighting flag on every path of Observe (docs/DESIGN.md, Observe).
func TestFirstSightingTable(t *testing.T) {
	t.Run("match same epoch: false", func(t *testing.T) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 64})
		sk.Observe("k")
		if est, first := sk.Observe("k"); est != 2 || first {
			t.Fatalf("(%d, %v), want (2, false)", est, first)
		}
	})
	t.Run("match stale epoch (fold): true", func(t *testing.T) {
		sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64})
		for range 8 {
			sk.Observe("k")
		}
		clk.Advance(time.Second)
		if est, first := sk.Observe("k"); est != 5 || !first {
			t.Fatalf("(%d, %v), want (8>>1 + 1 = 5, true)", est, first)
		}
		if est, first := sk.Observe("k"); est != 6 || first {
			t.Fatalf("second in the new tick: (%d, %v), want (6, false)", est, first)
		}
	})
	t.Run("empty slot claimed: true", func(t *testing.T) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 64})
		if est, first := sk.Observe("new"); est != 1 || !first {
			t.Fatalf("(%d, %v), want (1, true)", est, first)
		}
	})
	t.Run("slot won via eviction: true", func(t *testing.T) {
		sk, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, chip)
		occupants := keysInBucket(sk, 0, 8, "occ", nil)
		for _, k := range occupants {
			sk.Observe(k) // count 1: M3's mask is empty below 9, so the draw always chips, and 1 - 1 = 0 evicts
		}
		avoid := map[uint16]bool{}
		for _, k := range occupants {
			avoid[uint16(sk.HashString(k)>>16)] = true
		}
		k := keysInBucket(sk, 0, 1, "new", avoid)[0]
		if est, first := sk.Observe(k); est != 1 || !first {
			t.Fatalf("(%d, %v), want (1, true)", est, first)
		}
		if st := sk.Stats(); st.Evictions != 1 {
			t.Fatalf("Evictions = %d, want 1", st.Evictions)
		}
		if b, _ := slotOf(sk, k); b < 0 {
			t.Fatalf("the winner is not tracked")
		}
	})
	t.Run("eviction challenge lost: (1, true)", func(t *testing.T) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1})
		occupants := keysInBucket(sk, 0, 8, "occ", nil)
		for _, k := range occupants {
			for range 1000 {
				sk.Observe(k)
			}
		}
		avoid := map[uint16]bool{}
		for _, k := range occupants {
			avoid[uint16(sk.HashString(k)>>16)] = true
		}
		k := keysInBucket(sk, 0, 1, "mouse", avoid)[0]
		for range 3 {
			if est, first := sk.Observe(k); est != 1 || !first {
				t.Fatalf("(%d, %v), want (1, true)", est, first)
			}
		}
		if st := sk.Stats(); st.ChallengesLost != 3 || st.Evictions != 0 || st.Chips != 0 {
			t.Fatalf("Stats = %+v, want 3 challenges lost and nothing chipped", st)
		}
		if sk.Estimate(k) != 0 {
			t.Fatalf("the loser is tracked")
		}
	})
}

// A chip takes one count at the victim's age and keeps its epoch, so the
// victim's own next sighting this tick still reads "seen already".
func TestChipKeepsVictimEpoch(t *testing.T) {
	sk, clk := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, chip)
	occupants := keysInBucket(sk, 0, 8, "occ", nil)
	for _, k := range occupants {
		for range 4 {
			sk.Observe(k)
		}
	}
	clk.Advance(time.Second) // every occupant now reads 2, stored as 4 at the old epoch
	avoid := map[uint16]bool{}
	for _, k := range occupants {
		avoid[uint16(sk.HashString(k)>>16)] = true
	}
	mouse := keysInBucket(sk, 0, 1, "mouse", avoid)[0]
	// eff 2 < 9: the draw always wins. Every occupant is equally weak, so
	// the first slot from the mouse's home, its home itself, is chipped.
	sk.Observe(mouse)
	if st := sk.Stats(); st.Chips != 1 {
		t.Fatalf("Stats = %+v, want one chip", st)
	}
	j := int(sk.HashString(mouse) >> 13 & (epochsketch.SlotsPerBucket - 1))
	w := sk.Word(0, j)
	if epochsketch.CountOf(w) != 2 || epochsketch.EpochOf(w) != epochsketch.EpochOf(sk.Word(0, (j+1)%8)) {
		t.Fatalf("chipped slot %d = count %d epoch %d: want count 4-2^1 = 2 at the old epoch", j, epochsketch.CountOf(w), epochsketch.EpochOf(w))
	}
	var victim string
	for _, k := range occupants {
		if _, i := slotOf(sk, k); i == j {
			victim = k
		}
	}
	if got := sk.Estimate(victim); got != 1 {
		t.Fatalf("chipped occupant %q reads %d, want 1", victim, got)
	}
}

func TestEstimateNeverWrites(t *testing.T) {
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 4})
	for i := range 200 {
		sk.Observe(fmt.Sprint("k", i%50))
	}
	snapshot := func() []uint64 {
		var out []uint64
		for b := range 4 {
			for j := range 8 {
				out = append(out, sk.Word(b, j))
			}
		}
		return out
	}
	before, stats, hw := snapshot(), sk.Stats(), sk.HighWater()
	clk.Advance(40 * time.Second) // everything is scrub-worthy now, but reads must not scrub
	for i := range 200 {
		sk.Estimate(fmt.Sprint("k", i))
		sk.EstimateBytes([]byte(fmt.Sprint("k", i)))
	}
	if after := snapshot(); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("Estimate changed slot words")
	}
	if sk.Stats() != stats || sk.HighWater() != hw {
		t.Fatalf("Estimate changed stats or the shared tick")
	}
}

// Scrub-on-write (docs/DESIGN.md): a writer zeroes siblings silent for >= 24 ticks.
func TestScrubOnWrite(t *testing.T) {
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 1})
	keys := keysInBucket(sk, 0, 4, "k", nil)
	for _, k := range keys[:3] {
		sk.Observe(k)
		// The largest count still reads 1 at age 23, so no one claims it.
		b, j := slotOf(sk, k)
		sk.SetWord(b, j, sk.Word(b, j)|epochsketch.CountMax)
	}
	clk.Advance(23 * time.Second)
	sk.Observe(keys[3])
	if st := sk.Stats(); st.ScrubbedZombies != 0 {
		t.Fatalf("age 23 scrubbed: %+v", st)
	}
	clk.Advance(time.Second) // keys[0..2] are 24 ticks old, keys[3] is 1
	sk.Observe(keys[3])
	if st := sk.Stats(); st.ScrubbedZombies != 3 {
		t.Fatalf("ScrubbedZombies = %d, want 3", st.ScrubbedZombies)
	}
	for _, k := range keys[:3] {
		if b, _ := slotOf(sk, k); b >= 0 {
			t.Errorf("%s survived the scrub", k)
		}
	}
}

// A key silent for a whole 2^24-tick wrap reappears with a small apparent
// age. Any write to its bucket in between must have erased it.
func TestWrapZombie(t *testing.T) {
	const wrap = 1 << 24
	run := func(touch bool, at int64) uint32 {
		sk, clk := newManual(t, epochsketch.Config{NumBuckets: 1, TickDuration: time.Second})
		keys := keysInBucket(sk, 0, 2, "k", nil)
		for range 1000 {
			sk.Observe(keys[0])
		}
		if touch {
			clk.Advance(time.Duration(at) * time.Second)
			sk.Observe(keys[1])
			clk.Advance(time.Duration(wrap+1-at) * time.Second)
		} else {
			clk.Advance((wrap + 1) * time.Second)
		}
		return sk.Estimate(keys[0])
	}
	if got := run(false, 0); got != 500 {
		t.Fatalf("control: an untouched bucket resurrects the zombie at %d (want 500): the residual of scrub-on-write", got)
	}
	for _, at := range []int64{24, 1000, wrap / 2, wrap - 1000, wrap - 24, wrap - 1} {
		if got := run(true, at); got != 0 {
			t.Errorf("a write %d ticks after the key's last one did not scrub it: reads %d after the wrap", at, got)
		}
	}
}

// Epochs are Unix time / tick mod 2^24, not ticks since start.
func TestEpochAnchoredToWallClock(t *testing.T) {
	for _, tick := range []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, time.Hour, 24 * time.Hour} {
		at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
		clk := epochsketch.NewManualClock(at)
		sk := epochsketch.New(epochsketch.Config{NumBuckets: 8, TickDuration: tick, Clock: clk, Seed: 3})
		sk.Observe("k")
		b, j := slotOf(sk, "k")
		want := uint32(at.UnixNano()/int64(tick)) & epochsketch.EpochMask
		if got := epochsketch.EpochOf(sk.Word(b, j)); got != want {
			t.Errorf("tick %v: epoch %d, want %d", tick, got, want)
		}
	}
	// Before 1970 too: floor division, not truncation.
	if got := epochsketch.TickOf(-1, int64(time.Second)); got != -1 {
		t.Errorf("tickOf(-1ns) = %d, want -1", got)
	}
}

// Stragglers never erase, scrub, shrink or rewind a newer slot.
func TestStragglers(t *testing.T) {
	t.Run("clock moved back", func(t *testing.T) {
		sk, clk := newManual(t, epochsketch.Config{NumBuckets: 1})
		keys := keysInBucket(sk, 0, 8, "k", nil)
		for range 50 {
			sk.Observe(keys[0])
		}
		b, j := slotOf(sk, keys[0])
		before := sk.Word(b, j)
		clk.Advance(-30 * time.Second)
		for _, k := range keys[1:] {
			sk.Observe(k)
		}
		if got := sk.Word(b, j); got != before {
			t.Fatalf("slot changed from %#x to %#x", before, got)
		}
		if est, first := sk.Observe(keys[0]); est != 51 || first {
			t.Fatalf("(%d, %v), want (51, false): the clock moved back, the slot's tick stands", est, first)
		}
		if got := epochsketch.EpochOf(sk.Word(b, j)); got != epochsketch.EpochOf(before) {
			t.Fatalf("epoch rewound from %d to %d", epochsketch.EpochOf(before), got)
		}
	})
	t.Run("late ObserveN", func(t *testing.T) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 8})
		sk.ObserveN(t0.Add(100*time.Second), "k", 1)
		sk.ObserveN(t0.Add(100*time.Second), "k", 1)
		if est, first := sk.ObserveN(t0.Add(10*time.Second), "k", 1); est != 3 || first {
			t.Fatalf("late record: (%d, %v), want (3, false)", est, first)
		}
		if got := sk.EstimateAt(t0, "k"); got != 3 {
			t.Fatalf("late read: %d, want 3", got)
		}
		if got := sk.EstimateBytesAt(t0, []byte("k")); got != 3 {
			t.Fatalf("late read of the bytes form: %d, want 3", got)
		}
	})
	t.Run("stale tick in flight", func(t *testing.T) {
		// A writer that read the tick, then slept past tick changes, sees
		// slots "ahead" of it: apparent age 2^24 - d, which a naive scrub
		// would erase.
		sk, clk := newManual(t, epochsketch.Config{NumBuckets: 1})
		keys := keysInBucket(sk, 0, 3, "k", nil)
		clk.Advance(30 * time.Second)
		for range 40 {
			sk.Observe(keys[0])
		}
		b, j := slotOf(sk, keys[0])
		before := sk.Word(b, j)
		stale := sk.HighWater() - 30
		for _, d := range []int64{1, 5, 30} {
			sk.ObserveHashAt(sk.HashString(keys[1]), stale+30-d)
			if got := sk.Word(b, j); got != before {
				t.Fatalf("straggler %d ticks behind changed %#x to %#x", d, before, got)
			}
			if got := sk.EstimateHashAt(sk.HashString(keys[0]), stale+30-d); got != 40 {
				t.Fatalf("straggling reader %d behind reads %d, want 40", d, got)
			}
		}
		if est, first := sk.ObserveHashAt(sk.HashString(keys[0]), stale); est != 41 || first {
			t.Fatalf("straggler refresh: (%d, %v), want (41, false)", est, first)
		}
		if got := epochsketch.EpochOf(sk.Word(b, j)); got != epochsketch.EpochOf(before) {
			t.Fatalf("straggler rewound the epoch from %d to %d", epochsketch.EpochOf(before), got)
		}
		if st := sk.Stats(); st.ScrubbedZombies != 0 {
			t.Fatalf("a straggler scrubbed: %+v", st)
		}
	})
	t.Run("stale tick, own slot the only newer one", func(t *testing.T) {
		for _, two := range []bool{false, true} {
			sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64, TwoChoice: two})
			clk.Advance(30 * time.Second)
			for range 9 {
				sk.Observe("k")
			}
			h := sk.HashString("k")
			if est, first := sk.ObserveHashAt(h, sk.HighWater()-3); est != 10 || first {
				t.Fatalf("two=%v: straggler refresh: (%d, %v), want (10, false)", two, est, first)
			}
		}
	})
}

// Mice cannot evict elephants: with counts in the thousands the chip mask is
// wider than 63 bits under M3 and 1.08^-C underflows under HeavyKeeper.
func TestMiceCannotEvictElephants(t *testing.T) {
	for _, lot := range lotteries {
		t.Run(string(lot), func(t *testing.T) {
			sk, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, lot)
			elephants := keysInBucket(sk, 0, 8, "elephant", nil)
			for _, k := range elephants {
				for range 5000 {
					sk.Observe(k)
				}
			}
			tags := map[uint16]bool{}
			for _, k := range elephants {
				tags[uint16(sk.HashString(k)>>16)] = true
			}
			for i := range 200_000 {
				// A mouse with an elephant's tag shares its count: that is
				// fingerprint collision (THEORY.md), not eviction.
				if m := fmt.Sprint("mouse", i); !tags[uint16(sk.HashString(m)>>16)] {
					sk.Observe(m)
				}
			}
			for _, k := range elephants {
				if got := sk.Estimate(k); got != 5000 {
					t.Errorf("elephant %s reads %d after a mouse flood, want 5000", k, got)
				}
			}
			if st := sk.Stats(); st.Evictions != 0 || st.Chips != 0 {
				t.Errorf("Stats = %+v, want no chips", st)
			}
		})
	}
}

// The lottery is not a fixed function of (key, victim word): a persistent
// challenger against weak, idle occupants gets in within a bounded expected
// number of attempts, with no tick passing.
func TestPersistentChallengerAdmitted(t *testing.T) {
	for _, lot := range lotteries {
		t.Run(string(lot), func(t *testing.T) {
			var total int
			const seeds, occupantCount = 50, 30
			for seed := range uint64(seeds) {
				sk, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1, Seed: seed + 1}, lot)
				occ := keysInBucket(sk, 0, 8, "occ", nil)
				avoid := map[uint16]bool{}
				for _, k := range occ {
					avoid[uint16(sk.HashString(k)>>16)] = true
					for range occupantCount {
						sk.Observe(k)
					}
				}
				ch := keysInBucket(sk, 0, 1, "challenger", avoid)[0]
				n := 0
				for sk.Estimate(ch) == 0 {
					if n++; n > 100_000 {
						t.Fatalf("seed %d: not admitted after %d attempts", seed, n)
					}
					sk.Observe(ch)
				}
				total += n
			}
			// Grinding one count-30 occupant to 0 takes sum over c of 1/P(c):
			// about 94 draws under M3, 70 under 1.08^-C.
			if mean := total / seeds; mean > 400 {
				t.Errorf("mean attempts to admission %d, want <= 400", mean)
			}
		})
	}
}

// The lockout bug of an earlier lottery design: a new sustained heavy hitter waited until
// an occupant decayed to zero. Chipping admits it well before that.
func TestNoLockout(t *testing.T) {
	for _, lot := range lotteries {
		t.Run(string(lot), func(t *testing.T) {
			for seed := range uint64(10) {
				sk, clk := newManualLottery(t, epochsketch.Config{NumBuckets: 1, Seed: seed + 1}, lot)
				occ := keysInBucket(sk, 0, 8, "occ", nil)
				avoid := map[uint16]bool{}
				for _, k := range occ {
					avoid[uint16(sk.HashString(k)>>16)] = true
					for range 1000 {
						sk.Observe(k)
					}
				}
				// v1 admits the newcomer when 1000 >> age == 0: age 10.
				ch := keysInBucket(sk, 0, 1, "attacker", avoid)[0]
				admitted := -1
				for tick := 0; tick < 10 && admitted < 0; tick++ {
					for range 1000 {
						sk.Observe(ch)
					}
					if sk.Estimate(ch) > 0 {
						admitted = tick
					}
					clk.Advance(time.Second)
				}
				if admitted < 0 || admitted > 6 {
					t.Errorf("seed %d: a 1000/tick newcomer admitted at tick %d, want <= 6 (v1: 10)", seed, admitted)
				}
			}
		})
	}
}

func TestSeedReproducible(t *testing.T) {
	run := func() []uint64 {
		sk, clk := newManual(t, epochsketch.Config{NumBuckets: 3, Seed: 99})
		for i := range 5000 {
			sk.Observe(fmt.Sprint("k", (i*7919)%300))
			if i%500 == 0 {
				clk.Advance(time.Second)
			}
		}
		var out []uint64
		for b := range 3 {
			for j := range 8 {
				out = append(out, sk.Word(b, j))
			}
		}
		st := sk.Stats()
		return append(out, st.Chips, st.Evictions, st.ChallengesLost)
	}
	if a, b := run(), run(); fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("two runs with one seed differ:\n%x\n%x", a, b)
	}
}

func TestTwoChoice(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 64, TwoChoice: true})
	for i := range 64 * 16 {
		sk.Observe(fmt.Sprint("k", i))
	}
	used := 0
	for b := range 64 {
		for j := range 8 {
			if sk.Word(b, j) != 0 {
				used++
			}
		}
	}
	// 1024 keys into 512 slots: the table fills, every slot used.
	if used != 512 {
		t.Errorf("%d of 512 slots used", used)
	}
	// Three sightings of a new key against a full table of count-1 mice: the
	// key gets in (a first challenge may bounce) and never reads above 3.
	admitted := 0
	for i := range 100 {
		k := fmt.Sprint("hot", i)
		for range 3 {
			sk.Observe(k)
		}
		got := sk.Estimate(k)
		if got > 3 {
			t.Errorf("%s reads %d after 3 sightings", k, got)
		}
		if got >= 2 {
			admitted++
		}
	}
	if admitted < 90 {
		t.Errorf("%d of 100 new keys admitted within 3 sightings, want >= 90", admitted)
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []struct {
		cfg  epochsketch.Config
		want string
	}{
		{epochsketch.Config{NumBuckets: -1}, "Config.NumBuckets is -1"},
		{epochsketch.Config{TickDuration: -time.Second}, "Config.TickDuration is -1s"},
		{epochsketch.Config{TickDuration: time.Microsecond}, "want at least 1ms"},
		{epochsketch.Config{Hash: 9}, "Config.Hash is HashKind(9)"},
		{epochsketch.Config{Hash: epochsketch.HashMaphash, Seed: 5}, "cannot be seeded from a number"},
	}
	for _, c := range bad {
		t.Run(c.want, func(t *testing.T) {
			err := c.cfg.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), "epochsketch: ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate() = %v, want an error starting with \"epochsketch: \" that says %q", err, c.want)
			}
			defer func() {
				if r, ok := recover().(error); !ok || r.Error() != err.Error() {
					t.Fatalf("New panicked with %v, want Validate's error %q", r, err)
				}
			}()
			epochsketch.New(c.cfg)
		})
	}
	for _, good := range []epochsketch.Config{{}, {NumBuckets: 1}, {TickDuration: time.Millisecond}, {Hash: epochsketch.HashSipHash13, Seed: 1}} {
		if err := good.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", good, err)
		}
	}
	cfg := epochsketch.Config{}
	sk := epochsketch.New(cfg)
	defer sk.Close()
	if cfg != (epochsketch.Config{}) {
		t.Errorf("New mutated its Config")
	}
	if sk.NumBuckets() != epochsketch.DefaultNumBuckets || sk.TickDuration() != time.Second {
		t.Errorf("defaults: %d buckets, tick %v", sk.NumBuckets(), sk.TickDuration())
	}
}

func TestParseNames(t *testing.T) {
	for _, k := range []epochsketch.HashKind{epochsketch.HashWyhash, epochsketch.HashMaphash, epochsketch.HashSipHash13} {
		if got, err := epochsketch.ParseHashKind(k.String()); err != nil || got != k {
			t.Errorf("ParseHashKind(%q) = %v, %v", k, got, err)
		}
	}
	if _, err := epochsketch.ParseHashKind("fnv1a"); err == nil || !strings.Contains(err.Error(), "unknown hash") {
		t.Errorf("ParseHashKind(fnv1a) = %v", err)
	}
	if k, err := epochsketch.ParseHashKind("wyhash"); err != nil || k != (epochsketch.Config{}).Hash {
		t.Errorf("ParseHashKind(wyhash) = %v, %v: want the zero Config's hash", k, err)
	}
}

func TestBucketsFor(t *testing.T) {
	for _, c := range []struct{ n, want int }{{-5, 1}, {0, 1}, {1, 1}, {2, 1}, {3, 2}, {100, 50}, {10_000, 5000}, {131_072, 65_536}} {
		if got := epochsketch.BucketsFor(c.n); got != c.want {
			t.Errorf("BucketsFor(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// A duplicate fingerprint (which only racing claims across a tick boundary
// can create) is folded into the first slot by the next write of that key.
func TestDuplicateHealed(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprint("two=", two), func(t *testing.T) {
			sk, _ := newManual(t, epochsketch.Config{NumBuckets: 8, TwoChoice: two})
			// A key whose slot is not the last of its last bucket, so that
			// the copy planted there comes after it in slot order (a key
			// claims its home slot, which the hash picks).
			var k string
			for i := 0; k == ""; i++ {
				c := fmt.Sprint("k", i)
				sk.Observe(c)
				bs := sk.Buckets(sk.HashString(c))
				if b, j := slotOf(sk, c); b != bs[len(bs)-1] || j != 7 {
					k = c
				}
			}
			for range 4 {
				sk.Observe(k)
			}
			b, j := slotOf(sk, k)
			w := sk.Word(b, j)
			// Plant a copy with count 3 in the last slot of the key's last bucket.
			bs := sk.Buckets(sk.HashString(k))
			last := bs[len(bs)-1]
			sk.SetWord(last, 7, w&^uint64(epochsketch.CountMax)|3)
			if est, _ := sk.Observe(k); est != 6 {
				t.Fatalf("refresh of the first copy = %d, want 6", est)
			}
			if got := sk.Word(last, 7); got != 0 {
				t.Fatalf("duplicate still there: %#x", got)
			}
			if got := sk.Estimate(k); got != 9 {
				t.Fatalf("merged estimate %d, want 6 + 3 = 9", got)
			}
		})
	}
}

// A copy before the key's home slot is the first copy: the next write
// refreshes it and folds the home slot into it, and reads take it.
func TestDuplicateBeforeHome(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 8})
	var k string
	for i := 0; k == ""; i++ {
		c := fmt.Sprint("k", i)
		sk.Observe(c)
		if _, j := slotOf(sk, c); j != 0 {
			k = c
		}
	}
	for range 4 {
		sk.Observe(k)
	}
	b, j := slotOf(sk, k)
	w := sk.Word(b, j)
	sk.SetWord(b, 0, w&^uint64(epochsketch.CountMax)|3)
	if got := sk.Estimate(k); got != 3 {
		t.Fatalf("Estimate = %d, want the first copy's 3", got)
	}
	if est, _ := sk.Observe(k); est != 4 {
		t.Fatalf("refresh of the first copy = %d, want 3 + 1", est)
	}
	if got := sk.Word(b, j); got != 0 {
		t.Fatalf("home copy still there: %#x", got)
	}
	if got := sk.Estimate(k); got != 9 {
		t.Fatalf("merged estimate %d, want 4 + 5 = 9", got)
	}
}

// A refresh whose CAS lost retries on the slot's word as it reads now, and
// only while the slot still holds the key written this tick; anything else
// goes back to the full path, with the lost CAS counted as one attempt.
func TestRetryAfterLostCAS(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 8})
	for range 5 {
		sk.Observe("k")
	}
	b, j := slotOf(sk, "k")
	h := sk.HashString("k")
	w := sk.Word(b, j)
	tag, e := epochsketch.TagOf(w), epochsketch.EpochOf(w)
	if est, tried := sk.Retry(b, j, h, 2); est != 7 || tried != 0 {
		t.Fatalf("retry on the key's word = (%d, %d), want (7, 0)", est, tried)
	}
	if got := sk.Word(b, j); got != epochsketch.Pack(tag, e, 7) {
		t.Fatalf("word after the retry %#x, want count 7 at the same epoch", got)
	}
	sk.SetWord(b, j, epochsketch.Pack(tag, e, epochsketch.CountMax))
	if est, _ := sk.Retry(b, j, h, 1); est != epochsketch.CountMax {
		t.Fatalf("retry at MaxCount = %d, want it parked at %d", est, epochsketch.CountMax)
	}
	for _, c := range []struct {
		name string
		w    uint64
	}{
		{"another key took the slot", epochsketch.Pack(tag^1, e, 3)},
		{"the slot was emptied", 0},
		{"the key's slot is from an earlier tick", epochsketch.Pack(tag, e-1, 3)},
	} {
		sk.SetWord(b, j, c.w)
		if est, tried := sk.Retry(b, j, h, 1); est != 0 || tried != 1 {
			t.Errorf("%s: retry = (%d, %d), want (0, 1): back to the full path", c.name, est, tried)
		}
		if got := sk.Word(b, j); got != c.w {
			t.Errorf("%s: the retry wrote %#x over %#x", c.name, got, c.w)
		}
	}
}

// Two claimers of one new key that read the bucket on either side of a tick
// boundary can claim different slots: the stale one an empty slot, the fresh
// one a slot that died at the boundary. Whichever claimed second finds the
// other in its post-claim check and folds the later slot into the earlier.
func TestDedupeAfterRacingClaims(t *testing.T) {
	for _, claimedSecond := range []int{0, 7} {
		t.Run(fmt.Sprint("second claim at slot ", claimedSecond), func(t *testing.T) {
			sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1})
			h := sk.HashString("new")
			tag := uint16(h >> 16)
			e := epochsketch.EpochOf(epochsketch.Pack(0, uint32(sk.HighWater()), 0))
			sk.SetWord(0, 0, epochsketch.Pack(tag, e, 1)) // the fresh claimer's slot
			sk.SetWord(0, 7, epochsketch.Pack(tag, e, 2)) // the stale claimer's, already refreshed once
			sk.Dedupe(h, claimedSecond)
			if sk.Word(0, 7) != 0 {
				t.Fatalf("the later slot survived: %#x", sk.Word(0, 7))
			}
			if got := sk.Estimate("new"); got != 3 {
				t.Fatalf("merged estimate %d, want 1 + 2", got)
			}
		})
	}
}

func TestLocateAndSlots(t *testing.T) {
	for _, two := range []bool{false, true} {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 64, TwoChoice: two})
		for range 5 {
			sk.Observe("k")
		}
		b, second, tag := lab.Locate(sk, "k")
		want := sk.Buckets(sk.HashString("k"))
		if b != want[0] || (len(want) == 2) != (second >= 0) || (second >= 0 && second != want[1]) {
			t.Fatalf("two=%v: Locate = %d, %d; internal buckets %v", two, b, second, want)
		}
		found := false
		for _, bi := range want {
			for _, w := range lab.Slots(sk, bi) {
				if gt, _, c := lab.Fields(w); w != 0 && gt == tag {
					found = c == 5 && lab.Decayed(w, sk.HighWater()) == 5
				}
			}
		}
		if !found {
			t.Fatalf("two=%v: key's slot with count 5 not found through Slots", two)
		}
	}
}

func TestObserveN(t *testing.T) {
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64})
	if e, f := sk.ObserveN(time.Time{}, "k", 5); e != 5 || !f {
		t.Fatalf("new key weighted 5: (%d, %v)", e, f)
	}
	if e, f := sk.ObserveN(time.Time{}, "k", 3); e != 8 || f {
		t.Fatalf("plus 3: (%d, %v), want (8, false)", e, f)
	}
	if e, f := sk.ObserveN(time.Time{}, "k", 0); e != 8 || f || sk.Estimate("k") != 8 {
		t.Fatalf("weight 0 must only read: (%d, %v)", e, f)
	}
	clk.Advance(time.Second)
	if e, f := sk.ObserveN(time.Time{}, "k", 10); e != 8>>1+10 || !f {
		t.Fatalf("after a tick: (%d, %v), want (14, true)", e, f)
	}
	if e, _ := sk.ObserveN(time.Time{}, "k", 1<<31); e != epochsketch.MaxCount {
		t.Fatalf("a huge weight reads %d, want MaxCount", e)
	}
	if e, _ := sk.ObserveN(time.Time{}, "k", epochsketch.MaxCount); e != epochsketch.MaxCount {
		t.Fatalf("saturation: %d", e)
	}
	if e, _ := sk.ObserveBytesN(time.Time{}, []byte("b"), 7); e != 7 || sk.Estimate("b") != 7 {
		t.Fatalf("ObserveBytesN: %d", e)
	}
	if e, _ := sk.ObserveN(clk.Now().Add(2*time.Second), "k", 1); e != epochsketch.MaxCount>>2+1 {
		t.Fatalf("ObserveN two ticks on: %d", e)
	}
}

// The short and the explicit forms are one operation: ObserveN with the zero
// time and n = 1 leaves the same words as Observe, and a read (n = 0) at a
// later time does not move the sketch's clock.
func TestObserveNIsTheExplicitObserve(t *testing.T) {
	a, _ := newManual(t, epochsketch.Config{NumBuckets: 16, Seed: 3})
	b, _ := newManual(t, epochsketch.Config{NumBuckets: 16, Seed: 3})
	for i := range 2000 {
		k := fmt.Sprint("k", i%300)
		ea, fa := a.Observe(k)
		eb, fb := b.ObserveN(time.Time{}, k, 1)
		if ea != eb || fa != fb {
			t.Fatalf("op %d key %s: Observe (%d, %v), ObserveN(zero, k, 1) (%d, %v)", i, k, ea, fa, eb, fb)
		}
	}
	sk, clk := newManual(t, epochsketch.Config{NumBuckets: 64})
	sk.ObserveN(time.Time{}, "k", 8)
	if e, f := sk.ObserveN(clk.Now().Add(time.Hour), "k", 0); e != 0 || f {
		t.Fatalf("a read an hour on: (%d, %v), want (0, false)", e, f)
	}
	if e := sk.Estimate("k"); e != 8 {
		t.Fatalf("the read moved the clock: Estimate %d, want 8", e)
	}
	top := epochsketch.NewTopKFor(sk, 4)
	top.ObserveBytesN(time.Time{}, []byte("bytes"), 40)
	top.ObserveN(time.Time{}, "string", 30)
	if l := top.List(); len(l) != 2 || l[0].Key != "bytes" || l[0].Estimate != 40 || l[1].Key != "string" {
		t.Fatalf("TopK after ObserveBytesN and ObserveN: %+v", l)
	}
}

// A weighted newcomer cannot buy its way past heavy hitters: the lottery
// draws at most 64 times per call, and each draw against a count of 2000
// almost never wins.
func TestObserveNProtectsElephants(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1})
	for i := range 8 {
		sk.ObserveN(time.Time{}, fmt.Sprint("elephant", i), 2000)
	}
	for i := range 100 {
		sk.ObserveN(time.Time{}, fmt.Sprint("whale", i), 1_000_000)
	}
	for i := range 8 {
		if e := sk.Estimate(fmt.Sprint("elephant", i)); e < 1990 {
			t.Errorf("elephant %d reads %d after 100 weighted challengers", i, e)
		}
	}
	// Against light residents a weighted newcomer gets in at once, with the
	// weight not spent on the draws.
	light, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 1}, chip)
	for i := range 8 {
		light.Observe(fmt.Sprint("mouse", i))
	}
	if e, f := light.ObserveN(time.Time{}, "newcomer", 50); e != 50 || !f || light.Estimate("newcomer") != 50 {
		t.Fatalf("weighted newcomer against a count of 1: (%d, %v), reads %d; want the slot with all 50", e, f, light.Estimate("newcomer"))
	}
}

// ObserveN(t, key, w) with w <= 64 is w calls of Observe in one: the same
// draws in the same order (a seeded lottery), the same words, the same
// stats, from any state, for both lotteries and both layouts.
func TestObserveNEqualsRepeatedObserve(t *testing.T) {
	for _, lot := range lotteries {
		for _, two := range []bool{false, true} {
			for seed := uint64(1); seed <= 30; seed++ {
				a, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 2, TwoChoice: two, Seed: seed}, lot)
				b, _ := newManualLottery(t, epochsketch.Config{NumBuckets: 2, TwoChoice: two, Seed: seed}, lot)
				x := seed
				for i := range 400 {
					x = epochsketch.Splitmix(x)
					key := fmt.Sprint("k", x%40)
					w := uint32(1 + x>>40%64)
					if i%3 == 0 {
						w = 1
					}
					ea, fa := a.ObserveN(time.Time{}, key, w)
					var eb uint32
					var fb bool
					for j := range w {
						e, f := b.Observe(key)
						if j == 0 {
							fb = f
						}
						eb = e
					}
					if ea != eb && !(fa && ea == w) {
						t.Fatalf("%v two=%v seed %d op %d: ObserveN(%s, %d) = %d, %d Observes end at %d", lot, two, seed, i, key, w, ea, w, eb)
					}
					_ = fb
					for bk := range 2 {
						if lab.Slots(a, bk) != lab.Slots(b, bk) {
							t.Fatalf("%v two=%v seed %d op %d (%s x%d): bucket %d differs:\n%x\n%x", lot, two, seed, i, key, w, bk, lab.Slots(a, bk), lab.Slots(b, bk))
						}
					}
				}
			}
		}
	}
}
