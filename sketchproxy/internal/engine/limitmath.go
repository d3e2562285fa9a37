package engine

import (
	"math"
	"strconv"
	"time"
)

// LimitMath: how "Requests per Per, burst Burst" becomes a threshold on the
// decayed estimate.
//
// An EpochSketch count halves every tick T. A key arriving at a steady r
// requests per tick reads c(n) = c(n-1)/2 + r at the end of tick n, which
// converges to 2r: the estimate of a sustained rate is twice its per-tick
// rate (THEORY.md section 8 measures 2r-1 with the integer halving, which
// countsFor corrects for odd thresholds by counting each request twice). A quiet
// key (estimate 0) can send as many requests at once as the threshold.
//
// So a limit maps to a threshold and a tick:
//
//	threshold θ = Burst
//	tick      T = Burst · Per / (2 · Requests)
//
// A key at exactly the limit sends Requests·T/Per = Burst/2 per tick and
// converges to 2·Burst/2 = θ: it is never refused. A key at rate (1+ε) times
// the limit converges to (1+ε)θ and is refused once it passes θ. A quiet key
// gets Burst requests at once. With Rule.Refused "free" only allowed
// requests count, so a client over the limit still gets the limit; with
// "count" every request does, so a client that keeps hammering stays
// refused until its estimate decays. Retry-After says when (see RetryAfter).
//
// Limits whose ticks are equal share one sketch (keys are prefixed by rule
// and limit). The threshold is at most 2^23, half the saturation count.

// MaxThreshold is the largest threshold: a steady key reads up to twice its
// per-tick rate, and counts saturate at 2^24-1.
const MaxThreshold = 1 << 23

// TickFor is T = burst·per / (2·requests), rounded to the millisecond.
func TickFor(requests float64, per time.Duration, burst float64) time.Duration {
	t := time.Duration(burst * float64(per) / (2 * requests))
	if t >= time.Millisecond {
		t = t.Round(time.Millisecond)
	}
	return t
}

// thresholdFor is θ = burst, as a count.
func thresholdFor(burst float64) uint32 {
	return uint32(math.Max(1, math.Min(math.Round(burst), MaxThreshold)))
}

// countsFor is a limit's threshold in counts and the counts each request
// adds. An even θ is exact: a client over the limit is halved to θ/2 each
// tick and let through θ/2 requests, the limit. An odd θ would lose half a
// request to each halving (5 per second, θ = 5: 5 halves to 2, three more
// fit, so 6 a second), so each request counts 2 against 2θ: 10 halves to 5,
// two fit (9), 9 halves to 4, three fit (10), and the client gets 2.5 a tick.
func countsFor(burst float64) (theta, unit uint32) {
	theta = thresholdFor(burst)
	unit = 1 + theta&1
	return theta * unit, unit
}

// RetryAfter is how long until a key whose estimate is est can send add more
// units and stay within theta: the smallest k >= 1 with (est >> k) + add <=
// theta, counted from now to the start of the k-th next tick (ticks are
// anchored on the Unix epoch, like the sketch's). If add alone exceeds theta
// it is the time for the estimate to reach 0.
func RetryAfter(est, add, theta uint32, now time.Time, tick time.Duration) time.Duration {
	k := uint(1)
	for k < 24 && uint64(est>>k)+uint64(add) > uint64(theta) && est>>k > 0 {
		k++
	}
	return UntilTick(now, tick, int64(k))
}

// UntilNextTick is the time to the next tick boundary.
func UntilNextTick(now time.Time, tick time.Duration) time.Duration { return UntilTick(now, tick, 1) }

// UntilTick is the time to the start of the k-th next tick (ticks are
// anchored on the Unix epoch, like the sketch's).
func UntilTick(now time.Time, tick time.Duration, k int64) time.Duration {
	ns := now.UnixNano()
	return time.Duration((ns/int64(tick)+k)*int64(tick) - ns)
}

// WholePolicy writes "requests per per" as whole requests q per whole
// seconds w, as the RateLimit-Policy header needs (draft-ietf-httpapi-
// ratelimit-headers-10, sections 3.1.1 and 3.1.3: both Integers): 2.5 per
// minute is q=5;w=120 and 10 per 500ms is q=20;w=1. It scales both by the
// smallest m up to 1000 that makes them whole; a rate no such m fits is
// rounded down (a client keeping to it stays under the limit).
func WholePolicy(requests float64, per time.Duration) (q, w int64) {
	whole := func(x float64) bool { return math.Abs(x-math.Round(x)) < 1e-9*max(1, x) }
	secs := per.Seconds()
	for m := 1.0; m <= 1000; m++ {
		if whole(m*secs) && whole(m*requests) && m*secs >= 1 {
			return int64(math.Round(m * requests)), int64(math.Round(m * secs))
		}
	}
	w = int64(math.Ceil(secs))
	return int64(math.Floor(requests * float64(w) / secs)), w
}

// Seconds rounds a wait up to whole seconds, at least 1: Retry-After and
// the RateLimit field's t.
func Seconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// AppendItem appends one item of the RateLimit field to b, after a comma
// if b has items already: the policy's quoted name, its remaining quota r
// and the seconds t until more. Every door writes the field through it.
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
