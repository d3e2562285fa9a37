package engine

import (
	"math"
	"sync/atomic"
	"time"
)

// isNewKey reports whether key counts as new: first seen while new keys
// spike, and not yet proved real. A key active in one of the rule's limits
// (active) is known; otherwise the memory of keys (new_keys.remember)
// says. Rules with limits teach that memory once per tick a key is active
// (afterCount); budget-only rules here.
//
// A key first seen during a spike is marked for a quarter to half a window
// (markCount in ticks of Window/4). A request of it after that, while the
// mark has not yet decayed, proves it a returning client: it gets whole
// limits, and the meter's average learns it, once (tagProven). A
// rotation's keys, used once or all at once, never prove anything.
func (e *Engine) isNewKey(s *Set, ru *Rule, key string, now time.Time, active bool, sc *Scratch) bool {
	nk := &s.nk
	if nk.Disabled {
		return false
	}
	warm := e.warm(now, nk)
	grow := growth(nk, warm)
	// A mark lasts at most a window: without one that recent, no key is
	// marked, and the lookup is skipped.
	if last := e.lastNew.Load(); last != 0 && now.UnixNano()-last <= 2*int64(nk.Window) {
		sc.buf = skey(sc.buf, ru.Name, tagNew, key)
		switch est := s.newKeys.EstimateBytes(sc.buf); {
		case est >= markCount/2:
			return true
		case est > 0:
			sc.buf = skey(sc.buf, ru.Name, tagProven, key)
			if s.newKeys.EstimateBytes(sc.buf) == 0 {
				s.newKeys.ObserveBytesN(time.Time{}, sc.buf, markCount)
				e.spike.teach(now, nk, grow)
			}
			return false
		}
	}
	if active {
		return false
	}
	sc.buf = skey(sc.buf, ru.Name, tagKnown, key)
	if len(ru.Limits) > 0 {
		if s.known.EstimateBytes(sc.buf) > 0 {
			return false
		}
	} else if seen, _ := s.known.ObserveBytes(sc.buf); seen > 1 {
		return false
	}
	e.spike.first(now, nk, grow)
	if !warm || !e.spike.active(now, nk, grow) {
		e.spike.teach(now, nk, grow)
		return false
	}
	e.spike.mark()
	sc.buf = skey(sc.buf, ru.Name, tagNew, key)
	s.newKeys.ObserveBytesN(time.Time{}, sc.buf, markCount)
	e.lastNew.Store(now.UnixNano())
	return true
}

// markCount is a new key's mark, in the marks' sketch (ticks of a quarter
// window, each halving it): restricted while at least half of it is left
// (its quarter and the next), proved by a request in the two quarters
// after (2, then 1), forgotten then.
const markCount = 8

// markTick is the tick of the marks' sketch: a quarter of the window.
func markTick(nk *NewKeysSpec) time.Duration { return max(nk.Window/4, time.Millisecond) }

// warm reports whether the spike meter has learned enough to call a spike.
func (e *Engine) warm(now time.Time, nk *NewKeysSpec) bool {
	return e.restoredMeter.Load() || now.Sub(e.started) >= nk.Warmup
}

// Spiking reports whether new keys spike now, as a decision would judge
// it, and the meter's rate (new keys per second) and total.
func (e *Engine) Spiking(s *Set, now time.Time) (spike bool, rate float64, total uint64) {
	warm := e.warm(now, &s.nk)
	grow := growth(&s.nk, warm)
	rate, total = e.spike.rate(now, &s.nk, grow), e.spike.total.Load()
	return !s.nk.Disabled && warm && e.spike.active(now, &s.nk, grow), rate, total
}

// spikeMeter counts new keys per second and keeps a moving average of past
// seconds (about 30 s), with no goroutine: the first call in a new second
// rolls the window.
//
// The average is the baseline a spike is measured against, and it learns
// only what a rotation cannot fake cheaply (docs/rules-and-limits.md, New
// keys and key rotation): the new keys of seconds outside a spike, and,
// during one, only the keys first seen in it that proved real by coming
// back later (teach). It never falls during a spike (a flood's seconds
// teach it nothing, not even that new keys are rare), and its growth is
// capped at twice per new_keys.window, so that a ramp of new keys faster
// than that outgrows it and is a spike, however smooth.
type spikeMeter struct {
	sec    atomic.Int64
	cur    atomic.Int64  // new keys this second
	last   atomic.Int64  // the last whole second's count
	learn  atomic.Int64  // what the average learns of this second: unmarked new keys and proofs
	taught atomic.Int64  // the same for the last whole second
	marks  atomic.Int64  // keys marked new this second: a spike's second
	marked atomic.Int64  // the same for the last whole second
	avg    atomic.Uint64 // float64 bits: the moving average before that
	total  atomic.Uint64
}

const spikeAlpha = 1.0 / 30

// growth is how far the average may grow in a second: at most twice per
// window once warm, free while it learns from nothing (the warm-up).
func growth(nk *NewKeysSpec, warm bool) float64 {
	if !warm {
		return math.Inf(1)
	}
	return math.Exp2(float64(time.Second) / float64(max(nk.Window, time.Second)))
}

// first records a new key.
func (s *spikeMeter) first(now time.Time, nk *NewKeysSpec, grow float64) {
	s.roll(now, nk, grow)
	s.cur.Add(1)
	s.total.Add(1)
}

// mark records a key first seen during a spike: the average learns
// nothing of it (until it proves real: teach).
func (s *spikeMeter) mark() { s.marks.Add(1) }

// teach gives the average one key to learn: a new key first seen outside a
// spike, or one first seen during a spike that proved real by coming back.
func (s *spikeMeter) teach(now time.Time, nk *NewKeysSpec, grow float64) {
	s.roll(now, nk, grow)
	s.learn.Add(1)
}

func (s *spikeMeter) roll(now time.Time, nk *NewKeysSpec, grow float64) {
	sec := now.Unix()
	old := s.sec.Load()
	if old == sec || !s.sec.CompareAndSwap(old, sec) {
		return
	}
	n, l, m := s.cur.Swap(0), s.learn.Swap(0), s.marks.Swap(0)
	gap := sec - old
	if old == 0 || gap < 0 {
		gap = 1
	}
	if gap > 1 {
		n, l, m = 0, 0, 0 // the whole seconds between had none
	}
	a := math.Float64frombits(s.avg.Load())
	s.last.Store(n)
	prev, spiked := s.taught.Swap(l), s.marked.Swap(m) > 0
	// The cap's floor is the least average that can matter: below
	// MinPerSecond / SpikeFactor, MinPerSecond decides alone.
	limit := max(a, nk.MinPerSecond/max(nk.SpikeFactor, 1)) * grow
	next := min(a+spikeAlpha*(float64(prev)-a), max(a, limit))
	if spiked {
		next = max(a, next)
	} else {
		next *= math.Pow(1-spikeAlpha, float64(min(gap-1, 1000)))
	}
	a = next
	s.avg.Store(math.Float64bits(a))
}

// rate is the new keys per second now: the larger of the last whole second
// and the current one so far.
func (s *spikeMeter) rate(now time.Time, nk *NewKeysSpec, grow float64) float64 {
	s.roll(now, nk, grow)
	return float64(max(s.last.Load(), s.cur.Load()))
}

// active reports a spike: the rate above MinPerSecond and above SpikeFactor
// times the average of the seconds before.
func (s *spikeMeter) active(now time.Time, nk *NewKeysSpec, grow float64) bool {
	r := s.rate(now, nk, grow)
	return r > nk.MinPerSecond && r > nk.SpikeFactor*math.Float64frombits(s.avg.Load())
}
