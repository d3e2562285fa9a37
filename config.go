package epochsketch

import (
	"fmt"
	"math"
	"time"
)

// Defaults applied to zero Config fields.
const (
	// DefaultNumBuckets is 65,536 buckets: 4 MiB, room for 131,072 concurrent
	// heavy hitters at the safety factor of 4 (BucketsFor).
	DefaultNumBuckets = 1 << 16
	// DefaultTickDuration is one second: the API rate limiting row of the
	// Tick Table (counts halve every second, evaporate in 24 s).
	DefaultTickDuration = time.Second
	// MinTickDuration bounds how often the clock goroutine wakes.
	MinTickDuration = time.Millisecond
	// SafetyFactor is slots per expected concurrent heavy hitter, room for
	// the lottery's churn (docs/DESIGN.md, Sizing).
	SafetyFactor = 4
)

// maxBuckets keeps the table addressable: bucket indexes come from 32 hash
// bits, and the table must fit the platform's int (GOARCH=386 included).
var maxBuckets = min(uint64(1)<<32, uint64(math.MaxInt)/uint64(bucketSize)-1)

// lottery selects how a challenger competes for a full bucket
// (docs/DESIGN.md, The lottery). Every Sketch runs HeavyKeeper-classic: the
// weakest slot is chipped with probability exactly 1.08^-C from a real PRNG
// (integer thresholds precomputed at start, no float math per call).
// Hash-entropy chipping was to replace it only if its errors were
// statistically indistinguishable; over 50 seeds they were not (it chips
// every victim under 9 counts, 1.08^-C does not: THEORY.md section 1). It
// stays for the simulator and the experiments, which choose it through
// internal/lab. The values are the lottery's code in a snapshot header.
type lottery uint8

const (
	lotteryChip        lottery = 1
	lotteryHeavyKeeper lottery = 2
)

func (l lottery) String() string {
	switch l {
	case lotteryChip:
		return "the chip lottery"
	case lotteryHeavyKeeper:
		return "HeavyKeeper-classic"
	}
	return fmt.Sprintf("lottery %d", uint8(l))
}

// Config configures a Sketch. The zero Config is valid: every zero field
// means the documented default. New copies the Config; it never mutates it.
type Config struct {
	// NumBuckets is the number of 64-byte buckets of 8 slots; memory is
	// NumBuckets × 64 bytes whatever the number of distinct keys. 0 means
	// DefaultNumBuckets; any value from 1 up is valid. Size it with BucketsFor.
	NumBuckets int

	// TickDuration is the half-life: every count halves per tick and reads 0
	// after 24 silent ticks. 0 means DefaultTickDuration; otherwise at least
	// MinTickDuration.
	TickDuration time.Duration

	// Clock supplies the time. nil means the wall clock, read by one goroutine
	// per Sketch once per tick (see Sketch.Close) so that Observe pays one
	// atomic load for it. A *ManualClock is read exactly on every call. Any
	// other Clock is called on every operation.
	Clock Clock

	// Seed seeds the hash and the lottery. 0 means a random per-instance seed
	// (from crypto/rand). A non-zero Seed makes single-threaded runs with a
	// ManualClock reproducible bit for bit; then the lottery's salt is a
	// counter shared by all goroutines, so prefer 0 in production.
	Seed uint64

	// Hash selects the key hash; see HashKind for the threat model.
	Hash HashKind

	// TwoChoice gives each key two candidate buckets
	// (two cache lines per call), new keys go to the less loaded one, and the
	// lottery picks the weakest of 16 slots.
	TwoChoice bool

	// SmoothDecay makes counts halve over each tick in 32 steps instead of
	// at once at its end (docs/DESIGN.md, Smooth decay): a count read at a
	// step is the table's over 32 + step, rounded up, and an add of n
	// writes n × (32 + step). Counts are then at most about MaxCount/63,
	// and the wall clock's goroutine wakes at each step (at most once a
	// millisecond). Rate limiters count this way: package limit and
	// SketchProxy, so that quota comes back as time passes, not at once at
	// instants every key shares. A snapshot records it: one of a smooth
	// sketch reads back only into a smooth one.
	SmoothDecay bool
}

// Validate reports whether c is usable, with an error that says which field
// is wrong and what to do. New panics with the same message.
func (c Config) Validate() error {
	switch {
	case c.NumBuckets < 0:
		return fmt.Errorf("epochsketch: Config.NumBuckets is %d: want 0 (default %d) or a positive count of 64-byte buckets", c.NumBuckets, DefaultNumBuckets)
	case uint64(c.NumBuckets) > maxBuckets:
		return fmt.Errorf("epochsketch: Config.NumBuckets is %d: at most %d buckets are addressable on this platform", c.NumBuckets, maxBuckets)
	case c.TickDuration < 0:
		return fmt.Errorf("epochsketch: Config.TickDuration is %v: want 0 (default %v) or at least %v", c.TickDuration, DefaultTickDuration, MinTickDuration)
	case c.TickDuration > 0 && c.TickDuration < MinTickDuration:
		return fmt.Errorf("epochsketch: Config.TickDuration is %v: want at least %v (or 0 for %v)", c.TickDuration, MinTickDuration, DefaultTickDuration)
	case c.Hash > HashSipHash13:
		return fmt.Errorf("epochsketch: Config.Hash is %v: want HashWyhash (the zero value), HashMaphash or HashSipHash13", c.Hash)
	case c.Hash == HashMaphash && c.Seed != 0:
		return fmt.Errorf("epochsketch: Config.Hash is maphash but Config.Seed is %d: hash/maphash cannot be seeded from a number; use HashWyhash or HashSipHash13 for a reproducible seed, or Seed 0", c.Seed)
	}
	return nil
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.NumBuckets == 0 {
		c.NumBuckets = DefaultNumBuckets
	}
	if c.TickDuration == 0 {
		c.TickDuration = DefaultTickDuration
	}
	return c
}

// BucketsFor applies the sizing rule (docs/DESIGN.md, Sizing): buckets ≥ expected
// concurrent heavy hitters × SafetyFactor / 8 slots per bucket, at least 1.
// Size by the heavy hitters you must not lose, never by key cardinality:
// mice may collide and evaporate.
func BucketsFor(expectedHeavyHitters int) int {
	if expectedHeavyHitters <= 0 {
		return 1
	}
	n := (uint64(expectedHeavyHitters)*SafetyFactor + slotsPerBucket - 1) / slotsPerBucket
	return int(min(n, maxBuckets))
}
