package epochsketch

import (
	"math"
	"math/bits"
	"time"

	"github.com/epochsketch/epochsketch/internal/admit"
)

// noLimit is the limit of an unconditional add (Observe): no decayed count
// plus a weight (both at most countMax) passes it.
const noLimit = math.MaxUint32

// overLimit marks the estimate a conditional add returns when it refused:
// counts are below 2^24, so the bit is free.
const overLimit = 1 << 31

// admit is the conditional add that package limit is built on: it adds wt
// (1 to countMax) to hashed key h at tick now only if the key's decayed count
// plus wt stays within limit, in the same compare-and-swap that writes it, so
// racing callers on one key never pass the limit together. It returns the
// key's count after the add, or the count that refused it, and whether it
// added. A refusal writes nothing to the key's slot (a refused request is
// free); a new key takes the ordinary claim or challenge (docs/DESIGN.md,
// Observe), and one that cannot win a slot in a full bucket is admitted
// untracked, failing open like Observe's first-sighting answer. An update
// dropped after 4 lost compare-and-swaps is a refusal here (counted in
// Stats.CASRetriesExhausted), so contention never admits past the limit.
//
// Two exceptions remain, both of which read high rather than low: another
// key sharing the bucket and the 16-bit fingerprint shares the count
// (THEORY.md section 3), and racing claims of one new key across a tick
// boundary can leave two slots that are then merged into one count above
// the limit (see dedupe).
func (s *Sketch) admit(h uint64, now int64, wt, limit uint32) (uint32, bool) {
	if wt > limit {
		return s.estimate(h, now), false // never fits
	}
	if s.twoChoice {
		return unmark(s.observeView(h, now, wt, limit))
	}
	i := s.first(h)
	b := &s.table[i]
	tag := uint64(tagFrom(h))
	e := uint64(epoch24(now))
	m := matchMask(b, tag)
	if m == 0 {
		return unmark(s.observeBucket(b, i, h, now, wt, 0, true, limit))
	}
	if m&(m-1) == 0 {
		// The common case: the key holds one slot. Written this tick, its
		// count is current and nothing in the bucket is old (docs/DESIGN.md,
		// Scrub-on-write); otherwise it decays, unless a slot is old or ahead
		// of now, which observe1 handles.
		j := bits.TrailingZeros8(m)
		x := b.s[j].Load()
		if x>>tagShift == tag && (x>>epochShift&epochMask == e || !anyOld(b, e)) {
			c := countOf(x) >> (ageOf(x, uint32(e)) & 31) // no slot is old: age below 24
			if c+wt > limit {
				return c, false
			}
			if b.s[j].CompareAndSwap(x, pack(uint16(tag), uint32(e), c+wt)) {
				return c + wt, true
			}
			return unmark(s.observe1(b, i, h, now, wt, 1, limit))
		}
	}
	return unmark(s.observe1(b, i, h, now, wt, 0, limit))
}

// unmark turns observe's answer under a limit into admit's.
func unmark(est uint32, _ bool) (uint32, bool) { return est &^ overLimit, est&overLimit == 0 }

// admitAt is admit for key at time t (the zero t means the sketch's clock,
// as for ObserveN), also returning the tick it used; package limit reaches
// it through internal/admit.
func (s *Sketch) admitAt(t time.Time, key string, wt, limit uint32) (est uint32, ok bool, tick int64) {
	now := s.writeAt(t)
	est, ok = s.admit(s.h.str(key), now, wt, limit)
	return est, ok, now
}

// admitAtBytes is admitAt for a key held in a byte slice.
func (s *Sketch) admitAtBytes(t time.Time, key []byte, wt, limit uint32) (est uint32, ok bool, tick int64) {
	now := s.writeAt(t)
	est, ok = s.admit(s.h.bytes(key), now, wt, limit)
	return est, ok, now
}

func init() {
	admit.Register(func(sk any) (admit.Func, admit.BytesFunc) {
		s := sk.(*Sketch)
		return s.admitAt, s.admitAtBytes
	})
}
