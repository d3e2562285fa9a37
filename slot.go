package epochsketch

// A slot is one packed uint64 (docs/DESIGN.md, Slots):
//
//	 63            48 47                   24 23                    0
//	┌────────────────┬───────────────────────┬───────────────────────┐
//	│ tag (16 bits)  │  epoch (24 bits)      │  count (24 bits)      │
//	└────────────────┴───────────────────────┴───────────────────────┘
//
// The tag is a fingerprint of the key, the epoch is the tick of the last
// write (mod 2^24) and the count is the raw tally at that tick. The word 0 is
// the empty slot: every write stores a count of at least 1, so no live slot is
// ever 0.
const (
	countBits = 24
	epochBits = 24
	tagBits   = 64 - countBits - epochBits

	epochShift = countBits
	tagShift   = countBits + epochBits

	countMax  = 1<<countBits - 1 // a count parks here (docs/DESIGN.md: counts saturate)
	epochMask = 1<<epochBits - 1

	// evaporation is the age at which every count reads 0: count < 2^24, so
	// count >> 24 == 0 (docs/DESIGN.md, Decay interpreted at read time).
	evaporation = countBits

	// aheadAge marks an apparent age that is really a slot written at a later
	// tick than the reader's: ages in [aheadAge, 2^24) are "in the future" until
	// the reader reloads the current tick (see Sketch.observe).
	aheadAge = 1 << (epochBits - 1)

	slotsPerBucket = 8
)

// pack builds a slot word. count must be <= countMax.
func pack(tag uint16, epoch uint32, count uint32) uint64 {
	return uint64(tag)<<tagShift | uint64(epoch&epochMask)<<epochShift | uint64(count)
}

func tagOf(w uint64) uint16     { return uint16(w >> tagShift) }
func epochOf(w uint64) uint32   { return uint32(w>>epochShift) & epochMask }
func countOf(w uint64) uint32   { return uint32(w) & countMax }
func epoch24(tick int64) uint32 { return uint32(uint64(tick)) & epochMask }

// ageOf is the apparent age of w at epoch now: unsigned wrap subtraction mod
// 2^24.
func ageOf(w uint64, now uint32) uint32 { return (now - epochOf(w)) & epochMask }

// decay interprets a stored count at an age: count >> min(age, 63). The clamp
// is part of the definition (docs/DESIGN.md, Decay interpreted at read
// time): correctness must not rest on Go's defined behaviour for over-wide
// shifts.
func decay(count, age uint32) uint32 { return count >> min(age, 63) }

// effective is the decayed count of w at epoch now, without the "ahead" check:
// callers resolve ahead slots first.
func effective(w uint64, now uint32) uint32 { return decay(countOf(w), ageOf(w, now)) }

// satAdd adds w (at most countMax) and parks at countMax: a wrap would turn
// the largest elephant into an empty-looking slot.
func satAdd(c, w uint32) uint32 { return min(c+w, countMax) }

// MaxCount is the largest count a slot holds, 16,777,215 (2^24 - 1): counts
// park there and never wrap. A key sustaining more than MaxCount/2
// occurrences per tick reads MaxCount.
const MaxCount = 1<<24 - 1
