package admit

import (
	"math"
	"time"
)

// Steps is the number of steps a smooth sketch's tick is cut into
// (SetSmooth): in step j (0 to Steps-1) one external count is Steps+j
// internal counts, so that a count held in the table reads lower step by
// step, by a factor (Steps+j)/(Steps+j+1) at each, and by Steps·2/(2·Steps)
// = (2·Steps-1)/(2·Steps) at the tick's end where the table halves it:
// over a whole tick, exactly one halving, as a classic sketch's count, but
// in 32 small steps instead of one. docs/DESIGN.md, Smooth decay, gives the
// reasoning.
const Steps = 32

// MaxScale is the most internal counts one external count takes: in the
// last step of a tick, 2·Steps-1.
const MaxScale = 2*Steps - 1

// MaxCount is the largest external count a smooth sketch holds: its table's
// 24-bit counts hold MaxScale internal counts for each.
const MaxCount = (1<<24 - 1) / MaxScale

// Bounds are the starts of a tick's steps, in nanoseconds from the tick's
// start: step j begins at ceil(tick · log2((Steps+j)/Steps)), so that an
// external count reads as if it halved continuously, sampled at the
// instants where the reading crosses a whole step. Bounds[0] is 0.
type Bounds [Steps]int64

// BoundsFor computes the bounds of a tick of length tick. It runs once per
// sketch (floating point, off the hot path); every caller that needs a
// step takes it from the same table, so that the table's steps and the
// waits computed from them agree to the nanosecond.
func BoundsFor(tick time.Duration) Bounds {
	var b Bounds
	for j := 1; j < Steps; j++ {
		x := math.Ceil(float64(tick) * math.Log2(float64(Steps+j)/Steps))
		b[j] = min(int64(x), int64(tick)-1)
		b[j] = max(b[j], b[j-1])
	}
	return b
}

// Step returns the step of a tick at rem nanoseconds from its start: 0
// before the start (rem < 0), Steps-1 at or past its end.
func (b *Bounds) Step(rem int64) int {
	if rem <= 0 {
		return 0
	}
	lo, hi := 0, Steps-1 // b[lo] <= rem; the answer is in [lo, hi]
	for lo < hi {
		m := (lo + hi + 1) / 2
		if b[m] <= rem {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return lo
}

// Scale is the internal counts of one external count in step j.
func Scale(j int) uint32 { return uint32(Steps + j) }

// Reading is what a smooth sketch's conditional add saw of a key: its
// external count (rounded up, so that est + n <= limit exactly when the
// add fits), the internal count behind it, and the tick and step it was
// read at. Package rate computes exact waits from it.
type Reading struct {
	Est    uint32 // the external count; Pressure may be set (Func)
	Raw    uint32 // the internal count at Tick, Step: Est = ceil(Raw/Scale(Step))
	Tick   int64
	Step   uint8
	Smooth bool // read from a smooth sketch (else Raw is Est)
}

// Scale is the table's counts per count of the reading's step: Scale(Step)
// for a smooth sketch, 1 otherwise.
func (r Reading) Scale() uint32 {
	if !r.Smooth {
		return 1
	}
	return Scale(int(r.Step))
}

// Norm is the count as a classic sketch's would read at the start of the
// tick: the internal count over Scale(0), rounded up, which halves at
// each tick's end and holds still within a tick, so that counts of
// smooth sketches can be summed and halved tick by tick as SketchProxy's
// fleets do. Within step j, a limit of θ external counts is θ ·
// Scale(j)/Scale(0) of these.
func (r Reading) Norm() uint32 {
	if !r.Smooth {
		return r.Raw
	}
	return (r.Raw + Scale(0) - 1) / Scale(0)
}

// Fit returns the first tick and step, at or after (tick, step), at which
// an internal count raw read at (tick, step) fits a request that needs the
// external count to be at most allowed: raw >> (ticks since) <=
// allowed · Scale(step). ok is false if it never fits (allowed is 0 and the
// count never reaches 0 within 24 ticks: it always does, since counts are
// below 2^24).
func Fit(raw, allowed uint32, tick int64, step int) (int64, int, bool) {
	return FitRatio(raw, 1, 0, allowed, tick, step)
}

// FitRatio is Fit for the test den · c + off <= num · Scale(step), where c
// is raw decayed to the tick (den >= 1): 2c + 1 <= (θ - 2) · s says a count
// is below half of θ - 2 external counts.
func FitRatio(raw, den, off, num uint32, tick int64, step int) (int64, int, bool) {
	for a := int64(0); a <= 24; a++ {
		c := uint64(raw>>min(a, 31))*uint64(den) + uint64(off)
		if a > 0 {
			step = 0
		}
		need := 0 // the first step whose scale holds c: c <= num·(Steps+j)
		switch {
		case c == 0:
		case num == 0:
			continue
		default:
			q := (c + uint64(num) - 1) / uint64(num) // ceil(c/num)
			if q > Steps {
				need = int(min(q-Steps, Steps)) // Steps: not within this tick
			}
		}
		if need < Steps {
			return tick + a, max(step, need), true
		}
	}
	return 0, 0, false
}
