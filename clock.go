package epochsketch

import (
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// Clock supplies the current time to a Sketch (Config.Clock).
type Clock interface {
	Now() time.Time
}

// ManualClock is a Clock that moves only when told to, for tests and replays.
// Sketches read it exactly: the tick they use is the clock's time divided by
// the tick duration, on every call. A negative Advance (or an earlier Set)
// moves it back, but a Sketch never rewinds: it keeps using the latest tick
// it has seen until the clock passes it again.
//
// The zero ManualClock reads the Unix epoch (1970-01-01 UTC). A ManualClock
// is safe for concurrent use and must not be copied after first use.
type ManualClock struct {
	_  noCopy
	ns atomic.Int64 // Unix nanoseconds
}

// NewManualClock returns a ManualClock reading t.
func NewManualClock(t time.Time) *ManualClock {
	c := new(ManualClock)
	c.ns.Store(t.UnixNano())
	return c
}

// Now returns the clock's time, in UTC.
func (c *ManualClock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

// Advance moves the clock by d; a negative d moves it back.
func (c *ManualClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Set moves the clock to t.
func (c *ManualClock) Set(t time.Time) { c.ns.Store(t.UnixNano()) }

// tickOf is the wall-clock-anchored tick number of Unix time ns: floor(ns /
// tick), so that ticks (and, mod 2^24, epochs) mean the same instant across
// restarts.
func tickOf(ns, tick int64) int64 {
	q := ns / tick
	if ns%tick < 0 {
		q--
	}
	return q
}

const cacheLine = 64

// clockState is the Sketch's view of time, alone on its cache line because
// every call reads it and only tick changes write it.
type clockState struct {
	clockFields
	_ [cacheLine - unsafe.Sizeof(clockFields{})%cacheLine]byte
}

type clockFields struct {
	// hw is the highest tick number any operation has used. It only grows:
	// a caller with an older time (a late log record, a clock stepped back)
	// uses hw instead, so no caller can rewind a slot (golang/go#71360).
	hw atomic.Int64
	// wall is true while the goroutine keeps hw current for the wall clock.
	wall atomic.Bool
	// sub is, for a smooth sketch on the wall clock, the goroutine's tick
	// and step (smooth.go): tick<<subShift | step, one word so that a
	// reader sees both from one instant. sm is the smooth sketch's steps,
	// nil for a classic one.
	sub atomic.Int64
	sm  atomic.Pointer[smoothState]
}

// advance raises hw to t if t is newer and returns the tick to use: max(t, hw).
func (c *clockState) advance(t int64) int64 {
	for {
		cur := c.hw.Load()
		if t <= cur {
			return cur
		}
		if c.hw.CompareAndSwap(cur, t) {
			return t
		}
	}
}

// ticker keeps a clockState's hw equal to the wall clock's tick. It sleeps
// until each tick boundary, so hw lags the wall clock by the timer's wake-up
// latency (well under a millisecond on an idle machine, longer on a saturated
// one) and is never ahead of it. It holds no reference to the Sketch, so the
// Sketch's cleanup can stop it.
type ticker struct {
	stop chan struct{}
	done chan struct{}
	wake chan struct{} // kick: a sketch made smooth, whose steps it must keep
	once sync.Once
}

func startTicker(c *clockState, tick int64) *ticker {
	c.advance(tickOf(time.Now().UnixNano(), tick))
	c.wall.Store(true)
	t := &ticker{stop: make(chan struct{}), done: make(chan struct{}), wake: make(chan struct{}, 1)}
	go t.run(c, tick)
	return t
}

// kick wakes the goroutine at once, to publish a smooth sketch's step.
func (t *ticker) kick() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *ticker) run(c *clockState, tick int64) {
	defer close(t.done)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-timer.C:
		case <-t.wake:
		}
		ns := time.Now().UnixNano()
		cur := tickOf(ns, tick)
		c.advance(cur)
		next := (cur+1)*tick - ns // just after the next tick boundary
		if sm := c.sm.Load(); sm != nil {
			// A smooth sketch: publish the step, and wake just after the
			// next step's start, no sooner than MinTickDuration.
			rem := ns - cur*tick
			j := sm.bounds.Step(rem)
			c.sub.Store(cur<<subShift | int64(j))
			if j+1 < len(sm.bounds) {
				next = max(sm.bounds[j+1]-rem, min(int64(MinTickDuration), next))
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(time.Duration(next))
	}
}

// signal tells the goroutine to exit, without waiting; the Sketch's cleanup
// calls it once the Sketch is unreachable.
func (t *ticker) signal(c *clockState) {
	t.once.Do(func() {
		c.wall.Store(false)
		close(t.stop)
	})
}

// close stops the goroutine and waits for it to exit.
func (t *ticker) close(c *clockState) {
	t.signal(c)
	<-t.done
}

// noCopy makes go vet's copylocks check report copies of the types that hold
// it.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
