package epochsketch

import (
	"math"
	"time"

	"github.com/epochsketch/epochsketch/internal/admit"
)

// noLimit is the limit of an unconditional add (Observe): no decayed count
// plus a weight (both at most countMax) passes it.
const noLimit = math.MaxUint32

// overLimit marks the estimate a conditional add returns when it refused:
// counts are below 2^24, so the bit is free.
const overLimit = 1 << 31

// pressure marks, beside overLimit, a new key refused by the overflow
// policy (admit.Pressure); the count beside it is the weakest key's.
const pressure = admit.Pressure

// overflow is admit's policy for a new key in a bucket full of keys at
// their limit (admit.Overflow, whose values it takes): challengeSlot
// applies it. Observe never reads it.
type overflow = admit.Overflow

const (
	overflowAdmit  = admit.Admit
	overflowRefuse = admit.Refuse
	overflowShare  = admit.Share
)

// admit is the conditional add that package limit is built on: it adds wt
// (1 to countMax) to hashed key h at the tick for t (writeAt: the zero t
// means the sketch's clock), returned as now, only if the key's decayed count
// plus wt stays within limit, in the same compare-and-swap that writes it, so
// racing callers on one key never pass the limit together. It returns the
// key's count after the add, or the count that refused it, and whether it
// added. A refusal writes nothing to the key's slot (a refused request is
// free); a new key takes the ordinary claim or challenge (docs/DESIGN.md,
// Observe), and one that cannot win a slot in a full bucket is admitted
// untracked, failing open like Observe's first-sighting answer. When the
// bucket is full of keys at their limit (the weakest holds at least half
// of it), the sketch's overflow policy decides instead (admit.Overflow:
// as above, refuse the new key, or refuse three in four at random). An
// update dropped after 4 lost compare-and-swaps is a refusal here (counted
// in Stats.CASRetriesExhausted), so contention never admits past the limit.
//
// Racing first adds of a new key are exact too while the tick stands
// still: they agree on one slot (weakestOf tests the tag; docs/DESIGN.md,
// Observe). Two exceptions remain, both of which read high rather than
// low: another key sharing the bucket and the 16-bit fingerprint shares
// the count (THEORY.md section 3), and racing claims of one new key across
// a tick boundary can leave two slots, each within the limit, that are
// then merged into one count above it (see dedupe).
func (s *Sketch) admit(t time.Time, h uint64, wt, limit uint32) (est uint32, ok, first bool, now int64) {
	if t.IsZero() {
		now = s.now() // writeAt's common case, without a call to writeAt
	} else {
		now = s.writeAt(t)
	}
	if wt > limit {
		return s.estimate(h, now), false, false, now // never fits
	}
	est, ok, first = s.admitAt(h, now, wt, limit, 1)
	return est, ok, first, now
}

// admitAt is admit at tick now, in the table's counts, for a scale sc of
// external counts to internal ones (1, or a smooth sketch's step's: the
// lottery draws in external counts). wt <= limit.
func (s *Sketch) admitAt(h uint64, now int64, wt, limit, sc uint32) (est uint32, ok, first bool) {
	if s.twoChoice {
		return unmark(s.observeView(h, now, wt, limit, sc))
	}
	// The path Observe takes (refresh, then observeBucket), with the limit
	// in place of MaxCount in refresh's test; a lost CAS goes to observe1,
	// since retry adds unconditionally. Package limit's limits are below
	// MaxCount (limit.MaxBurst); a higher one takes observe1 (whose count
	// saturates) without refresh.
	i := s.first(h)
	b := &s.table[i]
	if limit >= countMax {
		return unmark(s.observe1(b, i, h, now, wt, 0, limit, sc))
	}
	e, f, lost, miss := refresh(b, h, now, wt, limit)
	switch {
	case e != 0:
		return unmark(e, f)
	case lost != 0:
		return unmark(s.observe1(b, i, h, now, wt, 1, limit, sc))
	}
	return unmark(s.observeBucket(b, i, h, now, wt, 0, miss, limit, sc))
}

// ObserveNWithin is ObserveN that adds n only if key's decayed count plus
// n stays within limit: the check and the write are one compare-and-swap,
// so racing callers on one key never pass the limit together (a rate
// limiter's check and count in one step; package limit is built on it).
// It returns the key's count after the add, or the count that refused it;
// whether this was the key's first sighting in its tick; and whether it
// added. A refusal writes nothing to the key's slot. n above limit never
// fits; a limit of MaxCount or more never refuses (counts saturate). n == 0
// adds nothing and returns (EstimateAt(t, key), false, true).
//
// Where it can be wrong, the errors read high rather than low but for
// one: a new key that cannot win a slot in a bucket full of heavier keys
// is added untracked (it returns (min(n, MaxCount), true, true): it fails
// open, as Observe's first sighting does). Another key sharing the bucket
// and the 16-bit fingerprint shares the count (THEORY.md section 3);
// racing first adds of a new key across a tick boundary can leave two
// slots that are merged above the limit; and an add dropped after 4 lost
// compare-and-swaps is refused (Stats.CASRetriesExhausted).
func (s *Sketch) ObserveNWithin(t time.Time, key string, n, limit uint32) (estimate uint32, first, added bool) {
	return s.observeNWithin(t, s.h.str(key), n, limit)
}

// ObserveBytesNWithin is ObserveNWithin for a key held in a byte slice.
func (s *Sketch) ObserveBytesNWithin(t time.Time, key []byte, n, limit uint32) (estimate uint32, first, added bool) {
	return s.observeNWithin(t, s.h.bytes(key), n, limit)
}

// observeNWithin is ObserveNWithin for a hashed key.
func (s *Sketch) observeNWithin(t time.Time, h uint64, n, limit uint32) (uint32, bool, bool) {
	if n == 0 {
		est, _ := s.observeN(t, h, 0)
		return est, false, true
	}
	if s.sm != nil {
		r, ok, first := s.admitSmooth(t, h, n, limit)
		return r.Est &^ pressure, first, ok
	}
	est, ok, first, _ := s.admit(t, h, min(n, countMax), limit)
	return est &^ pressure, first, ok
}

// unmark turns observe's answer under a limit into admit's: the count,
// whether it added, and whether it was the key's first sighting this tick.
func unmark(est uint32, first bool) (uint32, bool, bool) {
	return est &^ overLimit, est&overLimit == 0, first
}

// admitFuncs returns s's conditional adds by key, for package limit. With
// SipHash-1-3, package limit's hash, they call it directly rather than
// through the hasher's switch on the kind: one call less on every Allow.
// They read the key from s on every call, so that a key adopted later
// (ReadFrom) is the one used.
func (s *Sketch) admitFuncs() (admit.Func, admit.BytesFunc) {
	if s.sm != nil {
		if s.h.kind == HashSipHash13 {
			return func(t time.Time, key string, wt, limit uint32) (admit.Reading, bool) {
					r, ok, _ := s.admitSmooth(t, sipHash13(key, s.h.sip), wt, limit)
					return r, ok
				}, func(t time.Time, key []byte, wt, limit uint32) (admit.Reading, bool, bool) {
					return s.admitSmooth(t, sipHash13(key, s.h.sip), wt, limit)
				}
		}
		return func(t time.Time, key string, wt, limit uint32) (admit.Reading, bool) {
				r, ok, _ := s.admitSmooth(t, s.h.str(key), wt, limit)
				return r, ok
			}, func(t time.Time, key []byte, wt, limit uint32) (admit.Reading, bool, bool) {
				return s.admitSmooth(t, s.h.bytes(key), wt, limit)
			}
	}
	classic := func(est uint32, ok, first bool, now int64) (admit.Reading, bool, bool) {
		return admit.Reading{Est: est, Raw: est &^ pressure, Tick: now}, ok, first
	}
	if s.h.kind == HashSipHash13 {
		return func(t time.Time, key string, wt, limit uint32) (admit.Reading, bool) {
				r, ok, _ := classic(s.admit(t, sipHash13(key, s.h.sip), wt, limit))
				return r, ok
			}, func(t time.Time, key []byte, wt, limit uint32) (admit.Reading, bool, bool) {
				return classic(s.admit(t, sipHash13(key, s.h.sip), wt, limit))
			}
	}
	return func(t time.Time, key string, wt, limit uint32) (admit.Reading, bool) {
			r, ok, _ := classic(s.admit(t, s.h.str(key), wt, limit))
			return r, ok
		}, func(t time.Time, key []byte, wt, limit uint32) (admit.Reading, bool, bool) {
			return classic(s.admit(t, s.h.bytes(key), wt, limit))
		}
}

// allowFunc returns s's AllowFunc: the conditional add at s's clock,
// answering only whether it added.
func (s *Sketch) allowFunc() admit.AllowFunc {
	if s.sm != nil {
		if s.h.kind == HashSipHash13 {
			return func(key string, wt, limit uint32) bool {
				return s.allowSmooth(sipHash13(key, s.h.sip), wt, limit)
			}
		}
		return func(key string, wt, limit uint32) bool { return s.allowSmooth(s.h.str(key), wt, limit) }
	}
	return func(key string, wt, limit uint32) bool {
		_, ok, _, _ := s.admit(time.Time{}, s.h.str(key), wt, limit)
		return ok
	}
}

// forget clears every slot holding hashed key h's tag (a duplicate
// included), so that its next add is a new key's: package limit's Reset.
// Zeroing a slot is what a scrub or a drain does to one, and a racing
// writer that read the old word loses its compare-and-swap and looks
// again. A lost compare-and-swap here means another writer's succeeded on
// the slot, so forget tries again, after the wait a lost refresh takes
// (backoff), until the slot is cleared or holds another key.
func (s *Sketch) forget(h uint64) {
	v := s.viewOf(h)
	tag := tagFrom(h)
	for i := 0; i < v.n; i++ {
		for tried := 1; ; tried++ {
			x := v.at(i).Load()
			if x == 0 || tagOf(x) != tag || v.at(i).CompareAndSwap(x, 0) {
				break
			}
			backoff(min(tried, maxAttempts-1))
		}
	}
}

// admitCounts is the conditional add's part of the sketch's counters.
func (s *Sketch) admitCounts() admit.Counts {
	n := s.stats.sum()
	return admit.Counts{
		Untracked:      n[statUntracked],
		Evictions:      n[statEvictions],
		EvictedAtLimit: n[statEvictedAtLimit],
		ChippedAtLimit: n[statChippedAtLimit],
		RefusedNew:     n[statRefusedNew],
		Contended:      n[statContended],
	}
}

func init() {
	admit.Register(func(sk any) (admit.Func, admit.BytesFunc) { return sk.(*Sketch).admitFuncs() })
	admit.RegisterAllow(func(sk any) admit.AllowFunc { return sk.(*Sketch).allowFunc() })
	admit.RegisterSmooth(
		func(sk any) { sk.(*Sketch).setSmooth() },
		func(sk any, t time.Time, key []byte) admit.Reading { return sk.(*Sketch).ReadBytes(t, key) })
	admit.RegisterOps(
		func(sk any, o admit.Overflow) { sk.(*Sketch).overflow = o },
		func(sk any) admit.Counts { return sk.(*Sketch).admitCounts() },
		func(sk any, key string) { s := sk.(*Sketch); s.forget(s.h.str(key)) },
	)
}
