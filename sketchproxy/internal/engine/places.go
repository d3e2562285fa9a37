package engine

import "time"

// hold takes a tarpit place for rule's key (a delayed request held, a
// refusal dripped), or reports the tarpit's caps full: tarpitting never
// holds more than MaxHeld requests in all, MaxHeldPerKey of one key.
func (e *Engine) hold(rule, key string, t *TarpitSpec) bool {
	if e.held.Add(1) > int64(t.MaxHeld) {
		e.held.Add(-1)
		return false
	}
	if !e.heldKeys.Acquire(rule, key, t.MaxHeldPerKey) {
		e.held.Add(-1)
		return false
	}
	return true
}

// release gives a tarpit place back.
func (e *Engine) release(rule, key string) {
	e.heldKeys.Add(rule, key, -1)
	e.held.Add(-1)
}

// Held is how many requests the tarpit holds now.
func (e *Engine) Held() int64 { return e.held.Load() }

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
