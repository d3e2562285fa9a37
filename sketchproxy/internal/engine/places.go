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
// spike, within the last window or two. A key active in one of the rule's
// limits (active) is known; otherwise the memory of keys (new_keys.remember)
// says. Rules with limits teach that memory once per tick a key is active
// (afterCount); budget-only rules here.
func (e *Engine) isNewKey(s *Set, ru *Rule, key string, now time.Time, active bool, sc *Scratch) bool {
	nk := &s.nk
	if nk.Disabled {
		return false
	}
	// A mark lasts at most two windows: without one that recent, no key is
	// marked, and the lookup is skipped.
	if last := e.lastNew.Load(); last != 0 && now.UnixNano()-last <= 3*int64(nk.Window) {
		sc.buf = skey(sc.buf, ru.Name, tagNew, key)
		if s.newKeys.EstimateBytes(sc.buf) > 0 {
			return true
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
	e.spike.first(now)
	if !e.spike.active(now, nk) || !e.warm(now, nk) {
		return false
	}
	// Marked for between one and two windows (a count of 2 halves to 0 at
	// the second window boundary).
	sc.buf = skey(sc.buf, ru.Name, tagNew, key)
	s.newKeys.ObserveBytesN(time.Time{}, sc.buf, 2)
	e.lastNew.Store(now.UnixNano())
	return true
}

// warm reports whether the spike meter has learned enough to call a spike.
func (e *Engine) warm(now time.Time, nk *NewKeysSpec) bool {
	return e.restoredMeter.Load() || now.Sub(e.started) >= nk.Warmup
}

// Spiking reports whether new keys spike now, as a decision would judge
// it, and the meter's rate (new keys per second) and total.
func (e *Engine) Spiking(s *Set, now time.Time) (spike bool, rate float64, total uint64) {
	rate, total = e.spike.rate(now), e.spike.total.Load()
	return !s.nk.Disabled && e.spike.active(now, &s.nk) && e.warm(now, &s.nk), rate, total
}
