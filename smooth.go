package epochsketch

import (
	"time"

	"github.com/epochsketch/epochsketch/internal/admit"
)

// Smooth decay (docs/DESIGN.md, Smooth decay): a sketch that package limit
// or SketchProxy's engine made smooth (admit.SetSmooth) reads its counts in
// 32 steps per tick instead of halving them at once at the tick's end. The
// table is unchanged, and so is everything that runs over it: slots still
// hold a count that halves each tick (count >> age). What changes is the
// unit: in step j of a tick one count, as callers see it (an external
// count), is 32+j counts in the table (internal ones). An add of n in step
// j writes n·(32+j); a read returns ceil(internal/(32+j)). So a count held
// in the table reads a little lower at each step, 32+j to 32+j+1, and at
// the tick's end, where the table halves it and the scale falls back to
// 32, by 63 to 64: the count that callers see halves over each tick, as a
// classic sketch's does, in 32 steps of 1.6% to 3% instead of one of 50%,
// so that a rate limiter built on it gives quota back as time passes, not
// all at once at instants shared by every key.
//
// Every comparison stays exact in integers: an add of n within a limit
// fits exactly when internal + n·(32+j) <= limit·(32+j), which is
// ceil(internal/(32+j)) + n <= limit. The lottery draws in external counts
// (one draw per external unit of weight, chips of one external count), so
// that who wins a slot is what it is in a classic sketch.

// smoothState is a smooth sketch's steps: where each begins within a tick.
type smoothState struct {
	bounds admit.Bounds
}

// setSmooth makes s smooth. It is called before s is shared.
func (s *Sketch) setSmooth() {
	if s.sm != nil {
		return
	}
	s.sm = &smoothState{bounds: admit.BoundsFor(time.Duration(s.tick))}
	if s.tk != nil {
		s.clk.sm.Store(s.sm)
		s.tk.kick()
	}
}

// stepAt is the step, within tick (the tick an operation at t uses), of
// time t: the zero t means the sketch's clock. A time before tick's start
// (t older than the latest tick seen) is its step 0; one past its end (the
// wall clock's goroutine late to raise the tick) its last step.
func (s *Sketch) stepAt(t time.Time, tick int64) int {
	var ns int64
	switch {
	case !t.IsZero():
		ns = t.UnixNano()
	case s.manual != nil:
		ns = s.manual.ns.Load()
	case s.custom != nil:
		ns = s.custom.Now().UnixNano()
	default:
		if sub := s.clk.sub.Load(); sub>>subShift == tick {
			return int(sub & (1<<subShift - 1))
		} else if sub>>subShift > tick {
			return admit.Steps - 1
		} else if s.clk.wall.Load() {
			return 0
		}
		ns = time.Now().UnixNano()
	}
	rem := ns - tick*s.tick
	if rem >= s.tick {
		return admit.Steps - 1
	}
	return s.sm.bounds.Step(rem)
}

// subShift packs a tick and a step in the wall clock's sub: tick<<subShift
// | step.
const subShift = 6

// scaleUp is an external weight or limit in internal counts at scale sc,
// parked at countMax.
func scaleUp(n, sc uint32) uint32 {
	return uint32(min(uint64(n)*uint64(sc), countMax))
}

// scaleDown is an internal count in external ones at scale sc, rounded up:
// a multiply by sc's reciprocal instead of a division, on every add
// (exact for every count below 2^25: TestScaleDownExact).
func scaleDown(c, sc uint32) uint32 {
	return uint32(uint64(c+sc-1) * recips[sc-admit.Steps] >> recipShift)
}

// recips[j] is ceil(2^recipShift / (Steps + j)): floor(x / s) is
// x · recips >> recipShift for every x below 2^25 (x · s < 2^recipShift).
var recips = func() (r [admit.Steps]uint64) {
	for j := range r {
		s := uint64(admit.Steps + j)
		r[j] = (1<<recipShift + s - 1) / s
	}
	return r
}()

const recipShift = 40

// smoothLimit is an admit limit in internal counts: a limit of MaxCount or
// more (in external counts) never refuses.
func smoothLimit(limit, sc uint32) uint32 {
	switch l := uint64(limit) * uint64(sc); {
	case l > countMax:
		return countMax // never refuses: the counts saturate
	case l == countMax:
		return countMax - 1 // package rate's largest burst at a tick's last step: refresh's path, one count stricter
	default:
		return uint32(l)
	}
}

// admitSmooth is admit for a smooth sketch: the same add, in internal
// counts at the step of t, answered in external counts with the reading
// behind them.
func (s *Sketch) admitSmooth(t time.Time, h uint64, wt, limit uint32) (r admit.Reading, ok, first bool) {
	var now int64
	if t.IsZero() {
		now = s.now()
	} else {
		now = s.writeAt(t)
	}
	j := s.stepAt(t, now)
	sc := admit.Scale(j)
	r.Tick, r.Step, r.Smooth = now, uint8(j), true
	if wt > limit {
		r.Raw = s.estimate(h, now)
		r.Est = scaleDown(r.Raw, sc)
		return r, false, false
	}
	raw, ok, first := s.admitAt(h, now, scaleUp(wt, sc), smoothLimit(limit, sc), sc)
	r.Raw = raw &^ pressure
	r.Est = scaleDown(r.Raw, sc) | raw&pressure
	return r, ok, first
}

// allowSmooth is admitSmooth at the sketch's clock for a caller that needs
// only whether it added (package limit's Allow): no reading to build, no
// rounding back.
func (s *Sketch) allowSmooth(h uint64, wt, limit uint32) bool {
	now := s.now()
	// stepAt's wall-clock case, inline: a call to stepAt costs Allow about
	// 3 ns (12% on one hot key, by turns); every other clock takes it.
	var sc uint32
	if sub := s.clk.sub.Load(); sub>>subShift == now && s.manual == nil && s.custom == nil {
		sc = admit.Scale(int(sub & (1<<subShift - 1)))
	} else {
		sc = admit.Scale(s.stepAt(time.Time{}, now))
	}
	if wt > limit {
		return false
	}
	_, ok, _ := s.admitAt(h, now, scaleUp(wt, sc), smoothLimit(limit, sc), sc)
	return ok
}

// observeSmooth is observeN for a smooth sketch (n >= 1).
func (s *Sketch) observeSmooth(t time.Time, h uint64, n uint32) (uint32, bool) {
	now := s.writeAt(t)
	sc := admit.Scale(s.stepAt(t, now))
	raw, _, first := s.admitAt(h, now, scaleUp(n, sc), countMax, sc)
	return scaleDown(raw&^pressure, sc), first
}

// estimateSmooth is the estimate of a smooth sketch at tick now, read at t
// (the zero t: the sketch's clock).
func (s *Sketch) estimateSmooth(t time.Time, h uint64, now int64) uint32 {
	return scaleDown(s.estimate(h, now), admit.Scale(s.stepAt(t, now)))
}

// readingSmooth reads a smooth sketch's key at t without writing.
func (s *Sketch) readingSmooth(t time.Time, h uint64) admit.Reading {
	now := s.peekNow()
	if !t.IsZero() {
		now = s.readAt(t)
	}
	j := s.stepAt(t, now)
	raw := s.estimate(h, now)
	return admit.Reading{Est: scaleDown(raw, admit.Scale(j)), Raw: raw, Tick: now, Step: uint8(j), Smooth: true}
}

// Reading is what a smooth sketch read of a key (Sketch.ReadBytes): its
// count as callers see it (Est, rounded up), the count in the table behind
// it (Raw), and the tick and step it was read at, from which package rate
// computes exact waits. For a sketch without SmoothDecay, Raw is Est and
// Step 0.
type Reading = admit.Reading

// Read reads key's count at t (the zero t means the sketch's clock)
// without writing anything.
func (s *Sketch) Read(t time.Time, key string) Reading {
	return s.reading(t, s.h.str(key))
}

// ReadBytes is Read for a key held in a byte slice.
func (s *Sketch) ReadBytes(t time.Time, key []byte) Reading {
	return s.reading(t, s.h.bytes(key))
}

func (s *Sketch) reading(t time.Time, h uint64) Reading {
	if s.sm != nil {
		return s.readingSmooth(t, h)
	}
	now := s.peekNow()
	if !t.IsZero() {
		now = s.readAt(t)
	}
	est := s.estimate(h, now)
	return admit.Reading{Est: est, Raw: est, Tick: now}
}
