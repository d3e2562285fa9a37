// Package rate turns "Requests per Per, with bursts of Burst" into what an
// EpochSketch count enforces, and back into what a client is told. It is
// the one place where a limit's words become numbers: package limit, every
// door of SketchProxy (its proxy, forward-auth check, Envoy rate-limit
// service and Caddy module) and its fleets compile their limits here, so
// that the same words mean the same limit wherever they are written.
//
// # The mapping
//
// An EpochSketch count halves every tick T. The limiters count in smooth
// sketches (docs/DESIGN.md, Smooth decay), whose counts halve over each
// tick in 32 steps instead of at once at its end; a count that decays in
// proportion to itself falls by about c · ln 2 per tick. Each request adds
// u counts, and a limit compiles to
//
//	unit       u = 2 counts per request
//	threshold  θ = u · Burst + 1
//	tick       T = Per / (Requests · log2(1 + 33/(16 · (2 · Burst - 1))))
//
// A request is admitted while the key's count plus u stays within θ; a
// refused request adds nothing (the caller decides whether refusals count).
// A quiet key is admitted Burst at once (the one count more is half a
// request: it lets a key's quota come back one request at a time however
// small the burst). The tick is the longest at which a key that spreads
// its requests evenly at exactly Requests per Per is never refused: just
// before each of its requests it reads at most 2q/(1-q) counts (q, the
// decay between two of them), a step reads a count at most 33/32 of that,
// and it fits while that is at most θ - u. About Per · Burst · 0.7 /
// Requests; Per/log2(3)/Requests for a Burst of 1.
//
// # What a client may count on
//
//   - Evenly at the limit, never refused: a key sending one request every
//     Per/Requests, from any phase, from a quiet start. One that first
//     spends its burst, then sends evenly, may be refused one or two of its
//     first 30 requests, until the burst has decayed out of its count
//     (measured at 100 a minute, 50 a second and 3 a second with a burst
//     of 100, at three phases).
//   - A first burst: a quiet key gets Burst at once.
//   - The window bound: in any window of length w, sliding, a key is
//     admitted at most Burst × 17/16 + Requests × (1 + 5%) × w/Per + 1,
//     at any pattern of asks (TestWindowBound, in package limit, and
//     TestDoorsWindowBound, through every door of SketchProxy).
//   - At overload, the limit and at most Excess(Burst) more over time: 1.9%
//     to 2.7% (PerTick, the requests a never-quiet key gets per tick).
//   - Quota comes back as time passes, step by step, from each key's own
//     history: clients refused at different instants are told to come
//     back at different instants, not all at a tick's end.
//
// What it does not promise: a burst above Requests is a first burst, not a
// tolerance a steady client may spend again and again. A key held at its
// limit sits at the threshold whatever the burst, so a client that sends
// its quota in clumps (Requests at once every Per) is refused part of
// each clump; it needs a higher rate, not a higher burst.
//
// # Halving, for fleets and wallets
//
// CompileHalving compiles for a sketch whose counts halve at once at each
// tick's end, as SketchProxy's fleets still count (their shares are
// reckoned tick by tick) and its wallets do (a budget spent whole): θ = u ·
// Burst and T = Per · Burst / (2 · Requests). A key held at θ halves to
// u · Burst/2 each tick and so admits exactly Burst/2 requests a tick,
// Requests per Per; but half the burst comes back at once at each tick's
// end, for every key at the same instant.
//
// # The default Burst
//
// Burst defaults to Requests (rounded, at least 1, at most MaxBurst): "10
// per hour" admits at most 10 at once, as envoyproxy/ratelimit's window,
// go-chi/httprate and sethvargo/go-limiter do.
//
// # What a client is told
//
// [Limit.WaitFor] is how long until a key's count leaves room for n more
// requests, to the nanosecond, from what the sketch read of it (an
// admit.Reading); [Limit.Wait] reckons it from the rounded count alone,
// never short. [Limit.Status] gives the requests remaining and the seconds
// until one more request fits; [Limit.PolicyItem] and [AppendItem] write
// the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, with the policy in whole numbers
// ([WholePolicy]). Ticks and their steps are anchored on the Unix epoch, as
// the sketch's are, so every replica and every door agrees on them.
package rate

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"time"

	"github.com/epochsketch/epochsketch/internal/admit"
)

// Unit is the counts one request adds to a key's count: two, so that the
// threshold can hold the burst and half a request more (Threshold).
const Unit = 2

// MaxBurst is the largest Burst, 133,152: a key's count holds Unit counts
// per request, plus one, in a smooth sketch's external counts
// (epochsketch's smooth decay holds up to (2^24 - 1) / 63 of them).
const MaxBurst = (admit.MaxCount - 1) / Unit

// MaxBurstHalving is the largest Burst CompileHalving takes, 8,388,607:
// a halving sketch's count holds Unit counts per request up to its 24
// bits.
const MaxBurstHalving = (1<<24 - 1) / Unit

// MinTick is the shortest tick a limit may compile to: the sketch's
// epochsketch.MinTickDuration.
const MinTick = time.Millisecond

// Rate is a limit as people write it: Requests per Per, with bursts of
// Burst. The zero Burst means Requests (see the package documentation).
type Rate struct {
	// Requests per Per is the limit; it need not be whole (2.5 per
	// second is 5 per 2 s).
	Requests float64
	Per      time.Duration
	// Burst is the most requests a quiet key is admitted at once: 0 means
	// Requests rounded (at least 1, at most MaxBurst); else it is rounded
	// to a whole number from 1 to MaxBurst.
	Burst float64
}

// Limit is a compiled Rate: what a sketch enforces and what a client is
// told. Its fields are read-only once compiled; a Limit is a small value,
// safe to copy and to use from any number of goroutines.
type Limit struct {
	Requests float64       // as given
	Per      time.Duration // as given
	Burst    uint32        // whole: the default applied and rounded
	// Tick is the sketch's tick, its count's half-life: about Per ·
	// Burst · 0.7 / Requests (see the package documentation).
	Tick time.Duration
	// Threshold is Unit · Burst + 1, in counts: a quiet key's burst and
	// half a request, so that a key's quota comes back one request at a
	// time however small the burst.
	Threshold uint32
	// Q and W are the policy in whole numbers: Q requests per W seconds
	// (WholePolicy).
	Q, W int64

	steps *admit.Bounds // the steps of a tick (smooth decay)
	// halving: compiled for a sketch whose counts halve at each tick's
	// end (CompileHalving), not a smooth one.
	halving bool
}

// Error is a Rate that does not compile: Field names the part at fault
// ("Requests", "Per" or "Burst") so that a caller can say it in its own
// words (a YAML path, a Caddyfile subdirective); Msg says what is wrong and
// what to write instead.
type Error struct {
	Field string
	Msg   string
}

func (e *Error) Error() string { return "rate: " + e.Field + ": " + e.Msg }

// Compile checks r and compiles it.
func (r Rate) Compile() (Limit, error) {
	burst, err := r.burst(MaxBurst)
	if err != nil {
		return Limit{}, err
	}
	l := Limit{Requests: r.Requests, Per: r.Per, Burst: burst}
	l.Threshold = Unit*l.Burst + 1
	tick := float64(r.Per) * evenPerTick(l.Burst) / r.Requests
	switch {
	case tick >= math.MaxInt64:
		return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v with a burst of %d needs a tick beyond 292 years: lower the burst or Per", r.Requests, r.Per, l.Burst)}
	case tick < float64(MinTick):
		// The tick grows with the burst (about Burst · ln 2 per tick).
		b := l.Burst
		for b < MaxBurst && float64(r.Per)*evenPerTick(b)/r.Requests < float64(MinTick) {
			b = min(MaxBurst, max(b+1, b*2))
		}
		if float64(r.Per)*evenPerTick(b)/r.Requests < float64(MinTick) {
			return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v needs a tick of %v, under %v, and no burst up to %d lengthens it enough: write the rate over a longer Per, with Requests to match", r.Requests, r.Per, time.Duration(tick), MinTick, MaxBurst)}
		}
		for lo := l.Burst; lo < b; { // the least burst that does
			m := lo + (b-lo)/2
			if float64(r.Per)*evenPerTick(m)/r.Requests < float64(MinTick) {
				lo = m + 1
			} else {
				b = m
			}
		}
		return Limit{}, &Error{"Burst", fmt.Sprintf("%g per %v with a burst of %d needs a tick of %v, under %v: raise the burst to at least %d", r.Requests, r.Per, l.Burst, time.Duration(tick), MinTick, b)}
	}
	l.Tick = time.Duration(tick)
	b := admit.BoundsFor(l.Tick)
	l.steps = &b
	l.Q, l.W = WholePolicy(r.Requests, r.Per)
	return l, nil
}

// burst checks r's Requests, Per and Burst, and returns its whole burst
// (the default applied) of 1 to most.
func (r Rate) burst(most uint32) (uint32, error) {
	switch {
	case !(r.Requests > 0) || math.IsInf(r.Requests, 0):
		return 0, &Error{"Requests", fmt.Sprintf("%g: want a positive number of requests per Per", r.Requests)}
	case r.Per <= 0:
		return 0, &Error{"Per", fmt.Sprintf("%v: want a positive duration, such as 1s", r.Per)}
	case r.Burst < 0 || math.IsNaN(r.Burst) || math.Round(r.Burst) > float64(most):
		return 0, &Error{"Burst", fmt.Sprintf("%g: want 1 to %d (or 0: the same as Requests)", r.Burst, most)}
	case r.Burst > 0 && math.Round(r.Burst) < 1:
		return 0, &Error{"Burst", fmt.Sprintf("%g rounds to 0: want 1 to %d (or 0: the same as Requests)", r.Burst, most)}
	}
	burst := r.Burst
	if burst == 0 {
		burst = min(max(1, r.Requests), float64(most))
	}
	return uint32(math.Round(burst)), nil
}

// evenPerTick is the requests per tick of a key spreading its requests
// evenly at the most a limit of that burst never refuses: 1 /
// log2(1 + 33/(16·(2·burst - 1))). A key that sends one request every g
// reads, just before each, at most 2q/(1-q) counts (q = 2^(-g/T), the
// decay between two), and the sketch's steps read a count at most 33/32 of
// that, so it fits the threshold (2·burst + 1, less its own 2) while
// 2q/(1-q) · 33/32 <= 2·burst - 1. The tick is Per/Requests over this:
// such a key at exactly Requests per Per is never refused, and one that
// never stops asking gets PerTick(burst) requests a tick, 2% to 2.7% more
// than Requests per Per (TestOverloadRate).
func evenPerTick(burst uint32) float64 {
	k := 16 * (2*float64(burst) - 1) / 33
	return 1 / math.Log2(1+1/k)
}

// Excess is how much more than Requests per Per a key that never stops
// asking is admitted over time, as a fraction: PerTick(burst) ·
// log2(1 + 33/(16·(2·burst - 1))) - 1, from 1.9% to 2.7% (the cost of never
// refusing a key that spreads its requests evenly at the limit).
func Excess(burst uint32) float64 { return PerTick(burst)/evenPerTick(burst) - 1 }

// CompileHalving checks r and compiles it for a sketch whose counts halve
// at once at each tick's end, as every sketch's did before smooth decay,
// and as SketchProxy's fleets still count (docs/fleets.md): the threshold
// is Unit · Burst, the tick Per · Burst / (2 · Requests), and a key held at
// the threshold halves to Burst counts each tick, exactly Burst/2 requests
// a tick. Quota comes back at the tick's end, for every key at once.
func (r Rate) CompileHalving() (Limit, error) {
	burst, err := r.burst(MaxBurstHalving)
	if err != nil {
		return Limit{}, err
	}
	l := Limit{Requests: r.Requests, Per: r.Per, Burst: burst, halving: true}
	l.Threshold = Unit * l.Burst
	tick, ok := tickFor(r.Requests, r.Per, l.Burst)
	switch {
	case !ok:
		return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v with a burst of %d needs a tick beyond 292 years: lower the burst or Per", r.Requests, r.Per, l.Burst)}
	case tick < MinTick:
		need := math.Ceil(2 * r.Requests * float64(MinTick) / float64(r.Per))
		if need > MaxBurstHalving {
			return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v needs a tick of %v, under %v, and no burst up to %d lengthens it enough: write the rate over a Per of %v or more, with Requests to match", r.Requests, r.Per, tick, MinTick, MaxBurstHalving, MinTick)}
		}
		return Limit{}, &Error{"Burst", fmt.Sprintf("%g per %v with a burst of %d needs a tick of %v, under %v: raise the burst to at least %d", r.Requests, r.Per, l.Burst, tick, MinTick, int64(need))}
	}
	l.Tick = tick
	l.Q, l.W = WholePolicy(r.Requests, r.Per)
	return l, nil
}

// Halving reports whether l was compiled for a halving sketch
// (CompileHalving).
func (l *Limit) Halving() bool { return l.halving }

// tickFor is Per · burst / (2 · requests): exact (in 128 bits) when
// requests is whole, else in floating point. ok is false past
// math.MaxInt64 nanoseconds.
func tickFor(requests float64, per time.Duration, burst uint32) (time.Duration, bool) {
	if requests == math.Trunc(requests) && requests <= 1<<53 {
		hi, lo := bits.Mul64(uint64(per), uint64(burst))
		den := 2 * uint64(requests)
		if hi >= den {
			return 0, false
		}
		q, _ := bits.Div64(hi, lo, den)
		return time.Duration(q), q <= math.MaxInt64
	}
	t := float64(per) * float64(burst) / (2 * requests)
	if t >= math.MaxInt64 {
		return 0, false
	}
	return time.Duration(t), true
}

// PerTick is A(burst): how many requests a key that never stops asking is
// admitted per tick, on average, by a limit of that burst, in a smooth
// sketch's steps (epochsketch's smooth decay). It depends on the burst
// alone, not on the tick's length, since nothing changes within a step: it
// is computed once, by running the count of such a key over 1,024 ticks
// in integers, as the sketch counts it, after 24 ticks that bring it to
// its steady pattern. About Burst · ln 2 for a large burst; log2(3) ticks
// a request for a burst of 1.
func PerTick(burst uint32) float64 {
	const warm, ticks = 24, 1024
	theta := uint64(Unit*burst + 1)
	c := theta * uint64(admit.Scale(0)) // a key that just spent its burst
	var n uint64
	for t := 0; t < warm+ticks; t++ {
		for j := 0; j < admit.Steps; j++ {
			s := uint64(admit.Scale(j))
			if c+Unit*s <= theta*s {
				k := (theta*s - c) / (Unit * s)
				c += k * Unit * s
				if t >= warm {
					n += k
				}
			}
		}
		c >>= 1
	}
	return float64(n) / ticks
}

// Counts is the counts n requests add: n × Unit, at most 2^31 (far above
// any threshold, so that a caller can tell "never fits" from "fits").
func Counts(n uint64) uint32 {
	return uint32(min(n, 1<<30) * Unit)
}

// Remaining is how many requests fit at once for a key whose count is est
// (0 if none).
func (l *Limit) Remaining(est uint32) int64 {
	if est >= l.Threshold {
		return 0
	}
	return int64(l.Threshold-est) / Unit
}

// Wait is how long a key whose count is est must wait until add more
// counts fit within the threshold, measured from now: 0 if they fit now.
// est is a count as the sketch answers it (rounded up from the internal
// count behind it, which it does not give): Wait reckons with the largest
// internal count that rounds to est, so that the wait is never short, and
// at most the time one count takes to decay too long. WaitFor, given the
// Reading, is exact. If add alone exceeds the threshold (more requests
// than the whole burst) it never fits, and Wait is the time until the
// count is 0.
func (l *Limit) Wait(est, add uint32, now time.Time) time.Duration {
	if uint64(est)+uint64(add) <= uint64(l.Threshold) {
		return 0
	}
	if l.halving {
		// The start of the k-th next tick, for the smallest k >= 1 at
		// which est >> k leaves room (or the count is 0).
		k := int64(1)
		for k < 24 && uint64(est>>k)+uint64(add) > uint64(l.Threshold) && est>>k > 0 {
			k++
		}
		return UntilTick(now, l.Tick, k)
	}
	return l.WaitFor(l.largest(est, now), add, now)
}

// largest is the reading of a count est, rounded up from a count in a
// smooth sketch's table that it does not give, as the largest such count
// at now: waits reckoned from it are never short.
func (l *Limit) largest(est uint32, now time.Time) admit.Reading {
	tick, step := l.StepAt(now)
	return admit.Reading{Est: est, Raw: est * admit.Scale(step), Tick: tick, Step: uint8(step), Smooth: true}
}

// Scale is the counts a smooth sketch's table holds per count, at now, in
// l's steps (epochsketch.Config.SmoothDecay): 32 + the step; 1 for a
// halving limit. An exact model of the sketch's decisions reckons with it.
func (l *Limit) Scale(now time.Time) uint32 {
	if l.halving {
		return 1
	}
	_, step := l.StepAt(now)
	return admit.Scale(step)
}

// StepStart is the instant step begins in tick: a Reading's Tick and Step
// as a time, which a caller with a stale time measures its waits from.
func (l *Limit) StepStart(tick int64, step int) time.Time {
	if l.halving {
		return time.Unix(0, tick*int64(l.Tick))
	}
	return time.Unix(0, tick*int64(l.Tick)+l.steps[step])
}

// StepAt is the tick and the step of the tick at now.
func (l *Limit) StepAt(now time.Time) (tick int64, step int) {
	ns := now.UnixNano()
	tick = ns / int64(l.Tick)
	if ns%int64(l.Tick) < 0 {
		tick--
	}
	if l.halving {
		return tick, 0
	}
	return tick, l.steps.Step(ns - tick*int64(l.Tick))
}

// WaitFor is Wait for what the sketch read of the key (r: its count,
// tick and step), exact to the nanosecond: the key's count fits add more
// at now + WaitFor and not a nanosecond before, unless something else
// changes it. If add alone exceeds the threshold it is the time until the
// count is 0.
func (l *Limit) WaitFor(r admit.Reading, add uint32, now time.Time) time.Duration {
	if uint64(r.Est)+uint64(add) <= uint64(l.Threshold) {
		return 0
	}
	if l.halving {
		return l.Wait(r.Est, add, now)
	}
	allowed := l.Threshold - min(add, l.Threshold)
	tick, step, ok := admit.Fit(r.Raw, allowed, r.Tick, int(r.Step))
	if !ok {
		return math.MaxInt64
	}
	return l.until(now, tick, step)
}

// WaitBelowHalf is the time from now until a count read as r falls below
// half the threshold (below 1 for a Burst of 1, whose key is admitted
// again at 1): where a key is no longer at its limit, so that the sketch's
// overflow policy lets a new key take its slot.
func (l *Limit) WaitBelowHalf(r admit.Reading, now time.Time) time.Duration {
	if l.halving {
		return l.Wait(r.Est, l.Threshold/2+1, now)
	}
	half := l.Threshold
	if l.Threshold < 4 {
		half = 2*l.Threshold - 4
	}
	tick, step, ok := admit.FitRatio(r.Raw, 2, 1, half, r.Tick, int(r.Step))
	if !ok {
		return math.MaxInt64
	}
	return l.until(now, tick, step)
}

// until is the time from now to the start of step of tick (0 if past),
// saturating at the longest Duration.
func (l *Limit) until(now time.Time, tick int64, step int) time.Duration {
	cur := now.UnixNano() / int64(l.Tick)
	if now.UnixNano()%int64(l.Tick) < 0 {
		cur--
	}
	d := UntilTick(now, l.Tick, tick-cur)
	off := time.Duration(l.steps[step])
	if d > math.MaxInt64-off {
		return math.MaxInt64
	}
	return max(0, d+off)
}

// Reset is Status's t for a key whose count is est, with nothing more to
// add: the time until more quota.
func (l *Limit) Reset(est uint32, now time.Time) time.Duration {
	_, t, _ := l.Status(est, 0, now)
	return t
}

// Status is what the RateLimit field says of a key whose count is est,
// before a next request of add counts: r, the requests that still fit at
// once, and t, the time until more quota (one more request than r fits);
// over when add does not fit now, and then r is 0 and t the time until it
// fits (Wait). Like Wait, t is never short; StatusFor is exact.
func (l *Limit) Status(est, add uint32, now time.Time) (r int64, t time.Duration, over bool) {
	if l.halving {
		if uint64(est)+uint64(add) > uint64(l.Threshold) {
			return 0, l.Wait(est, add, now), true
		}
		if r = l.Remaining(est); r == 0 {
			return 0, l.Wait(est, Unit, now), false // two halvings with a Burst of 1
		}
		return r, UntilTick(now, l.Tick, 1), false
	}
	return l.StatusFor(l.largest(est, now), add, now)
}

// StatusFor is Status for what the sketch read of the key, exact: a
// client told t that waits t finds one more request than r fits (or, with
// a whole burst left, the key's count back to nothing).
func (l *Limit) StatusFor(rd admit.Reading, add uint32, now time.Time) (r int64, t time.Duration, over bool) {
	if l.halving {
		return l.Status(rd.Est, add, now)
	}
	if uint64(rd.Est)+uint64(add) > uint64(l.Threshold) {
		return 0, l.WaitFor(rd, add, now), true
	}
	r = l.Remaining(rd.Est)
	more := Counts(uint64(r) + 1)
	if more > l.Threshold-1 {
		more = l.Threshold - 1 // a whole burst: until the count is at most 1
	}
	t = l.WaitFor(rd, more, now)
	return r, t, false
}

// UntilTick is the time from now to the start of the k-th next tick of
// length tick (ticks are anchored on the Unix epoch, like the sketch's).
// A time beyond a Duration's 292 years (k ticks of a long limit) is the
// longest Duration, math.MaxInt64: never a negative one, which would tell
// a client to retry at once.
func UntilTick(now time.Time, tick time.Duration, k int64) time.Duration {
	ns := now.UnixNano()
	if k < 1 {
		return time.Duration((ns/int64(tick)+k)*int64(tick) - ns)
	}
	// k·tick - (ns mod tick), in 128 bits.
	rem := ns % int64(tick)
	hi, lo := bits.Mul64(uint64(k), uint64(tick))
	var c uint64
	if rem >= 0 {
		lo, c = bits.Sub64(lo, uint64(rem), 0)
		hi -= c
	} else {
		lo, c = bits.Add64(lo, uint64(-rem), 0)
		hi += c
	}
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(lo)
}

// PolicyItem is the limit's item of the RateLimit-Policy field, for a
// policy named by quoted (a quoted string: strconv.Quote of the name):
// "name";q=Q;w=W.
func (l *Limit) PolicyItem(quoted string) string {
	return quoted + ";q=" + strconv.FormatInt(l.Q, 10) + ";w=" + strconv.FormatInt(l.W, 10)
}

// AppendItem appends the limit's item of the RateLimit field for a key
// whose count is est, before a next request of add counts, to b (after a
// comma if b has items already): the policy's quoted name, r (Status's,
// never above Q) and t in whole seconds (Seconds). It returns whether the
// key is over, as Status does.
func (l *Limit) AppendItem(b []byte, quoted string, est, add uint32, now time.Time) ([]byte, bool) {
	r, t, over := l.Status(est, add, now)
	return AppendItem(b, quoted, min(r, l.Q), Seconds(t)), over
}

// AppendItem appends one item of the RateLimit field to b, after a comma
// if b has items already: a policy's quoted name, its remaining quota r
// and the seconds t until more.
func AppendItem(b []byte, quoted string, r, t int64) []byte {
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = append(b, quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, r, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, t, 10)
}

// Seconds rounds a wait up to whole seconds, at least 1: Retry-After and
// the RateLimit field's t count in seconds, and a client that retries
// early is refused.
func Seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++ // rounded up without d + 1 s, which overflows near the longest Duration
	}
	return max(1, s)
}

// WholePolicy writes requests per per as whole requests q per whole
// seconds w, as the RateLimit-Policy field needs (its q and w are
// Integers): 2.5 per minute is q=5;w=120 and 10 per 500ms is q=20;w=1. It
// scales both by the smallest m up to 1000 that makes them whole; a rate no
// such m fits is rounded down (a client keeping to it stays under the
// limit).
func WholePolicy(requests float64, per time.Duration) (q, w int64) {
	whole := func(x float64) bool { return math.Abs(x-math.Round(x)) < 1e-9*max(1, x) }
	for m := int64(1); m <= 1000; m++ {
		if p := m * int64(per); p/m == int64(per) && p%int64(time.Second) == 0 && whole(float64(m)*requests) {
			return int64(math.Round(float64(m) * requests)), p / int64(time.Second)
		}
	}
	w = int64((per + time.Second - 1) / time.Second)
	return int64(math.Floor(requests * float64(w) * float64(time.Second) / float64(per))), w
}
