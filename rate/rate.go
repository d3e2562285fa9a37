// Package rate turns "Requests per Per, with bursts of Burst" into what an
// EpochSketch count enforces, and back into what a client is told. It is
// the one place where a limit's words become numbers: package limit, every
// door of SketchProxy (its proxy, forward-auth check, Envoy rate-limit
// service and Caddy module) and its fleets compile their limits here, so
// that the same words mean the same limit wherever they are written.
//
// # The mapping
//
// An EpochSketch count halves every tick T. A key admitted at a steady r
// requests per tick, each adding u counts, reads c(n) = c(n-1)/2 + r·u at
// the end of tick n, which converges to 2·r·u: the count of a sustained
// rate is twice its per-tick rate. A quiet key (count 0) can add counts up
// to the threshold at once. So a limit compiles to
//
//	unit       u = 2 counts per request
//	threshold  θ = u · Burst
//	tick       T = Per · Burst / (2 · Requests)
//
// A key over the limit is admitted only while its count stays within θ; a
// refused request adds nothing (the caller decides whether refusals count).
// Held at θ, the count halves to u·Burst/2 each tick and so admits exactly
// Burst/2 requests a tick, Requests per Per. Two counts per request keep
// that exact when Burst is odd: the halving floors, and the admissions
// alternate between the two neighbours of Burst/2. A key sending at most
// Burst/2 requests per tick never passes θ.
//
// # The default Burst
//
// Burst defaults to Requests (rounded, at least 1): "10 per hour" admits at
// most 10 at once, as envoyproxy/ratelimit's window, go-chi/httprate and
// sethvargo/go-limiter do, and T is Per/2. A client that spreads its
// requests evenly at up to Requests per Per is never refused. One that
// sends its whole quota at once, then waits Per, finds a quarter of it
// still counted (two halvings): 3/4 of a quota in every later window. A
// service whose clients batch that way sets Burst to 2 × Requests: then
// T = Per, and any client sending at most Requests in every window of Per
// (sliding, aligned to nothing) is never refused, at the price of a first
// burst of 2 × Requests from a quiet key.
//
// # What a client is told
//
// [Limit.Wait] is how long until a key's count leaves room for n more
// requests (Retry-After); [Limit.Status] gives the requests remaining and
// the seconds until more quota; [Limit.PolicyItem] and [AppendItem] write
// the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, with the policy in whole numbers
// ([WholePolicy]). Ticks are anchored on the Unix epoch, as the sketch's
// are, so every replica and every door agrees on when a count halves.
package rate

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"time"
)

// Unit is the counts one request adds to a key's count: two, so that an
// odd Burst still halves to a whole number of counts each tick.
const Unit = 2

// MaxBurst is the largest Burst, 8,388,607: a key's count holds Unit
// counts per request and parks at the sketch's 24-bit maximum,
// epochsketch.MaxCount.
const MaxBurst = (1<<24 - 1) / Unit

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
	// Tick is the sketch's tick: Per · Burst / (2 · Requests).
	Tick time.Duration
	// Threshold is Unit · Burst, in counts.
	Threshold uint32
	// Q and W are the policy in whole numbers: Q requests per W seconds
	// (WholePolicy).
	Q, W int64
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
	switch {
	case !(r.Requests > 0) || math.IsInf(r.Requests, 0):
		return Limit{}, &Error{"Requests", fmt.Sprintf("%g: want a positive number of requests per Per", r.Requests)}
	case r.Per <= 0:
		return Limit{}, &Error{"Per", fmt.Sprintf("%v: want a positive duration, such as 1s", r.Per)}
	case r.Burst < 0 || math.IsNaN(r.Burst) || math.Round(r.Burst) > MaxBurst:
		return Limit{}, &Error{"Burst", fmt.Sprintf("%g: want 1 to %d (or 0: the same as Requests)", r.Burst, MaxBurst)}
	case r.Burst > 0 && math.Round(r.Burst) < 1:
		return Limit{}, &Error{"Burst", fmt.Sprintf("%g rounds to 0: want 1 to %d (or 0: the same as Requests)", r.Burst, MaxBurst)}
	}
	burst := r.Burst
	if burst == 0 {
		burst = min(max(1, r.Requests), MaxBurst)
	}
	l := Limit{Requests: r.Requests, Per: r.Per, Burst: uint32(math.Round(burst))}
	l.Threshold = Unit * l.Burst
	tick, ok := tickFor(r.Requests, r.Per, l.Burst)
	switch {
	case !ok:
		return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v with a burst of %d needs a tick beyond 292 years: lower the burst or Per", r.Requests, r.Per, l.Burst)}
	case tick < MinTick:
		need := math.Ceil(2 * r.Requests * float64(MinTick) / float64(r.Per))
		if need > MaxBurst {
			return Limit{}, &Error{"Per", fmt.Sprintf("%g per %v needs a tick of %v, under %v, and no burst up to %d lengthens it enough: write the rate over a Per of %v or more, with Requests to match", r.Requests, r.Per, tick, MinTick, MaxBurst, MinTick)}
		}
		return Limit{}, &Error{"Burst", fmt.Sprintf("%g per %v with a burst of %d needs a tick of %v, under %v: raise the burst to at least %d", r.Requests, r.Per, l.Burst, tick, MinTick, int64(need))}
	}
	l.Tick = tick
	l.Q, l.W = WholePolicy(r.Requests, r.Per)
	return l, nil
}

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
// counts fit within the threshold, measured from now: 0 if they fit now;
// else the time to the start of the k-th next tick, for the smallest k >= 1
// at which est >> k leaves room. If add alone exceeds the threshold (more
// requests than the whole burst) it never fits, and Wait is the time until
// the count is 0.
func (l *Limit) Wait(est, add uint32, now time.Time) time.Duration {
	if uint64(est)+uint64(add) <= uint64(l.Threshold) {
		return 0
	}
	k := int64(1)
	for k < 24 && uint64(est>>k)+uint64(add) > uint64(l.Threshold) && est>>k > 0 {
		k++
	}
	return UntilTick(now, l.Tick, k)
}

// Status is what the RateLimit field says of a key whose count is est,
// before a next request of add counts: r, the requests that still fit at
// once, and t, the time until more quota: the next halving, or, with none
// left (r is 0), the time until one request fits, which with a Burst of 1
// is two halvings away; over when add does not fit now, and then r is 0
// and t the time until it fits (Wait). A client that waits t finds what t
// promised.
func (l *Limit) Status(est, add uint32, now time.Time) (r int64, t time.Duration, over bool) {
	if uint64(est)+uint64(add) > uint64(l.Threshold) {
		return 0, l.Wait(est, add, now), true
	}
	if r = l.Remaining(est); r == 0 {
		return 0, l.Wait(est, Unit, now), false
	}
	return r, UntilTick(now, l.Tick, 1), false
}

// Reset is Status's t for a key whose count is est, with nothing more to
// add: the time until more quota.
func (l *Limit) Reset(est uint32, now time.Time) time.Duration {
	_, t, _ := l.Status(est, 0, now)
	return t
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
