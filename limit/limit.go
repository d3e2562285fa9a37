// Package limit is a per-key rate limiter in fixed memory, built on an
// EpochSketch: one line to create, one call per request, no map, no
// eviction goroutine, no lock.
//
//	l := limit.New(10, time.Second) // 10 requests per second per key
//	if !l.Allow(clientIP) {
//		// refuse: 429, ResourceExhausted, ...
//	}
//
// [Middleware] wraps an http.Handler, answering 429 with Retry-After and
// the RateLimit and RateLimit-Policy fields; [RemoteIP] keys it by the
// connection's address, [ClientIP] by the client's behind the proxies you
// trust. Its options check several limits together ([Also]), exempt
// requests ([Skip]), replace the refusal ([OnRefused]) and add the legacy
// X-RateLimit fields ([LegacyHeaders]); [Limiter.AddFields] writes the
// fields for a handler of your own. [Limiter.Wait] blocks until a key's
// request fits, serving a key's waiters in turn at its pace;
// [Limiter.Reset] forgets a key; [Limiter.Stats] counts
// what memory and contention changed. The module
// github.com/epochsketch/epochsketch/limit/grpclimit does the same for
// gRPC, a module of its own (its documentation gives the go.mod lines).
//
// A key is whatever string the caller passes: the empty string is a key
// like any other, shared by every request that has no key, so requests
// without one share one limit unless they are skipped ([Skip]).
//
// # What it promises
//
// A [Limiter] for Requests per Per keeps, for each key, a count that halves
// every tick, smoothly, in 32 steps (docs/DESIGN.md, Smooth decay), and
// admits a request only if the count plus the request stays within a
// threshold, in one compare-and-swap:
//
//   - A refused request is free: it adds nothing, so a client over its limit
//     still gets its limit.
//   - A key that keeps sending more than its limit, at any overload, is
//     admitted Requests per Per over time and at most 2.7% more
//     (rate.Excess), also for odd limits; an idle key may first send Burst
//     at once (by default Requests).
//   - In any window of length w, sliding, aligned to nothing, a key is
//     admitted at most Burst × 17/16 + Requests × 1.05 × w/Per + 1: no
//     tick's end gives half a burst back at once (TestWindowBound).
//   - A key that spreads its requests evenly at up to Requests per Per is
//     never refused, from a quiet start (one that has just spent its burst
//     may be refused one or two of its first 30 requests, until the burst
//     decays out of its count). A burst is a first burst only: a client that sends its
//     quota in clumps needs a higher rate.
//   - What a Decision says is true: a refused client that waits RetryAfter
//     is admitted, and one nanosecond less is not; one told Reset finds
//     more quota then (TestFieldsTruthful, over random histories).
//   - Quota comes back for each key from its own history, step by step:
//     clients refused at different instants are told to come back at
//     different instants, not all at a tick's end.
//   - Check and count are one atomic step: goroutines racing on one key,
//     its first requests included, never admit more than the limit
//     together (but see the tick boundary below).
//   - Memory is Config.NumBuckets × 64 bytes (4 MiB by default), whatever the
//     number of keys. Within its capacity in keys at their limit per tick
//     (Config.NumBuckets), a flood of new keys does not make the limiter
//     forget them; past it, Config.Overflow chooses between admitting
//     (failing open, the default), refusing new keys, and a share for
//     them, and [Limiter.Stats] counts what memory and contention changed.
//
// # How
//
// Package rate compiles the limit, as it does for SketchProxy, so the same
// words mean the same limit in both: one request adds 2 counts to the key's
// count; the threshold is 2 × Burst + 1 counts (the one more lets quota
// come back a request at a time, however small the burst); the sketch's
// tick (its half-life) is the longest at which a key at exactly Requests
// per Per, evenly, is never refused: about Per × Burst × 0.7 / Requests.
// Ticks and their steps are anchored on the Unix epoch, as the sketch's
// are. Package rate's documentation gives the reasoning.
//
// # Where it can be wrong
//
// The errors are a sketch's (github.com/epochsketch/epochsketch, Error
// direction), read for a limiter. A key that cannot win a slot in a bucket
// full of heavier keys is admitted untracked, and a new key that wins one
// from a key at its limit makes that key new again, so that it may pass
// its limit: both fail open (Stats.AdmittedUntracked, ChippedAtLimit,
// EvictedAtLimit), past the capacity of Config.NumBuckets, unless
// Config.Overflow says otherwise for buckets full of keys at their limit.
// A key sharing its bucket and 16-bit fingerprint with another shares its
// count, so it may be refused early (THEORY.md section 3 gives the odds).
// 4 compare-and-swaps in a row lost to racing writers of the same bucket
// refuse the request rather than admit it uncounted (Stats.Contended;
// Decision.RetryAfter is 0, and Middleware's Retry-After 1): that keeps
// the limit exact under any contention, at the price of rare refusals
// under it. 8 goroutines on one key far under its limit, on 2 cores
// (go test -race -count=3 -run TestContendedCounted -v ./limit, which
// logs the count: 3 runs of 262,144 calls): 0 refused in one session's
// runs, 1 to 24 (up to 0.009%) in another's; the race detector widens the
// races. The count depends on the machine and its load, and more cores
// racing on one key lose more: Stats.Contended shows the rate on yours.
// And the racing first
// requests of a new key at the instant a tick ends can claim two slots
// (one racer reads the bucket before the boundary, another after it, when
// a slot has decayed to free), each admitting up to the Burst, that are
// merged afterwards, so that together they pass the limit once. At any
// other instant racing first requests agree on one slot (TestRacingNewKey:
// 2,000 trials of 8 goroutines on a frozen clock).
//
// # Several replicas
//
// A Limiter counts in its own process. Processes that must enforce one
// limit together (replicas behind a load balancer) use SketchProxy's
// engine from Go instead: sketchproxy.NewLimiter (module
// github.com/epochsketch/epochsketch/sketchproxy) takes the same words
// plus a FleetConfig naming a Redis, answers Allow and Decide in this
// package's words, and shares only the keys heavy enough to matter, so
// that N replicas admit what one would (TestLimiterFleetOverRedis, on a
// real redis-server; the SketchProxy README's "Fleets" gives the measured
// table). This module itself stays free of dependencies.
package limit

import (
	"context"
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
	"github.com/epochsketch/epochsketch/rate"
)

// Limiter admits each key at most Requests per Per (see the package
// documentation for exactly what that means).
//
// The zero Limiter is not usable: create one with New or NewWith. A
// Limiter is safe for concurrent use by any number of goroutines and must
// not be copied. With the wall clock it runs one small goroutine; Close
// stops it, and so does the garbage collector once the Limiter is
// unreachable.
type Limiter struct {
	_ noCopy

	allow    admit.AllowFunc // Allow's: whether it added, nothing more
	add      admit.Func
	addBytes admit.BytesFunc
	lim      rate.Limit // the compiled rate: tick, threshold, policy
	clock    epochsketch.Clock
	sk       *epochsketch.Sketch
	policy   string // the RateLimit-Policy field
	quoted   string // the policy's name, quoted
	// sleep waits d or until ctx ends, for Wait: a timer; tests replace it
	// (export_test.go) to move a ManualClock instead.
	sleep func(ctx context.Context, d time.Duration) error
	w     waiters // Wait's queues, by key
}

// New returns a Limiter for requests per per, with the defaults of Config.
// It panics if requests < 1 or per <= 0, with Config.Validate's message.
func New(requests int, per time.Duration) *Limiter {
	return NewWith(Config{Requests: requests, Per: per})
}

// NewWith returns a Limiter for cfg. It panics with Validate's error if cfg
// is invalid; call cfg.Validate first to handle the error instead.
func NewWith(cfg Config) *Limiter {
	p, err := cfg.compile()
	if err != nil {
		panic(err)
	}
	sk := epochsketch.New(p.cfg)
	admit.SetOverflow(sk, [...]admit.Overflow{OverflowAdmit: admit.Admit, OverflowRefuse: admit.Refuse, OverflowShare: admit.Share}[cfg.Overflow])
	add, addBytes := admit.Bind(sk)
	l := &Limiter{allow: admit.BindAllow(sk), add: add, addBytes: addBytes, lim: p.lim, clock: cfg.Clock, sk: sk, sleep: sleep}
	l.setPolicy(cfg.Name)
	return l
}

// Close stops the wall-clock goroutine, if any. A Limiter keeps working
// after Close, reading the clock on every call. Close is idempotent and
// returns nil.
func (l *Limiter) Close() error { return l.sk.Close() }

// Allow reports whether one request of key may happen now, and counts it if
// so. It is AllowN(time.Time{}, key, 1).
func (l *Limiter) Allow(key string) bool {
	return l.allow(key, rate.Unit, l.lim.Threshold)
}

// AllowBytes is Allow for a key held in a byte slice: the same key space as
// Allow(string(key)), without the allocation that conversion costs.
func (l *Limiter) AllowBytes(key []byte) bool {
	_, ok, _ := l.addBytes(time.Time{}, key, rate.Unit, l.lim.Threshold)
	return ok
}

// AllowN reports whether n requests of key may happen at time t, and counts
// them if so, all or none. The zero t means the Limiter's clock. A t later
// than any seen so far moves the Limiter's time forward for every key; an
// earlier t counts at the latest time seen, so a late caller never rewinds
// a key's count. n above Burst never fits and reports false; n <= 0
// reports true and counts nothing.
//
// Take t from the Limiter's clock, or from a replay's own ordered times:
// time never moves back, so one t an hour ahead (a client's timestamp, a
// skewed host) ages every key by an hour at once, and until the clock
// catches up no count decays: each key gets its burst, then waits out the
// hour. A t past the year 2262 (beyond UnixNano) counts at the latest time.
func (l *Limiter) AllowN(t time.Time, key string, n int) bool {
	if n <= 0 {
		return true
	}
	if n > int(l.lim.Burst) {
		return false
	}
	_, ok := l.add(t, key, rate.Counts(uint64(n)), l.lim.Threshold)
	return ok
}

// Decision is the outcome of Decide: whether the requests were admitted,
// and what response headers say about the key. The zero Decision is a
// refusal with nothing left and no wait; a Decision is a plain value.
type Decision struct {
	// Allowed says the requests were admitted and counted.
	Allowed bool
	// Remaining is how many more requests of the key would be admitted
	// at once, now (after these, when they were admitted).
	Remaining int
	// Reset is the time until more quota: until one more request than
	// Remaining fits (reckoned from the count as the sketch rounds it, so
	// never short).
	Reset time.Duration
	// RetryAfter is, for a refusal, the time until the requests would
	// fit: 0 when they were admitted, and when they never fit (n above
	// Burst).
	RetryAfter time.Duration
}

// Decide is AllowN that also returns what a response says about the key,
// from the same compare-and-swap: no second lookup. The zero t means the
// Limiter's clock, read once (time.Now for the wall clock).
func (l *Limiter) Decide(t time.Time, key string, n int) Decision {
	if t.IsZero() {
		t = l.now()
	}
	var wt uint32
	var rd admit.Reading
	var ok bool
	if n > 0 && n <= int(l.lim.Burst) {
		wt = rate.Counts(uint64(n))
		rd, ok = l.add(t, key, wt, l.lim.Threshold)
	} else {
		// A weight above the threshold only reads the count.
		rd, _ = l.add(t, key, l.lim.Threshold+1, l.lim.Threshold)
		ok = n <= 0
	}
	return l.decision(rd, ok, wt, n, t)
}

// decision is what Decide answers for a reading rd of the key's count, at
// t (before the tick the sketch used, if the sketch had seen a later one:
// waits are measured from t, so a stale t never shortens a wait).
func (l *Limiter) decision(rd admit.Reading, ok bool, wt uint32, n int, t time.Time) Decision {
	pressed := rd.Est&admit.Pressure != 0
	rd.Est &^= admit.Pressure
	if at := l.lim.StepStart(rd.Tick, int(rd.Step)); t.Before(at) {
		t = at // counted at a later time than t: wait from then
	}
	d := Decision{Allowed: ok}
	if !pressed {
		// Reset from the count as answered, as every door of SketchProxy
		// reckons it: never short, at most a count's decay long.
		r, reset, _ := l.lim.Status(rd.Est, 0, t)
		d.Remaining, d.Reset = int(r), reset
	}
	if !ok && n <= int(l.lim.Burst) {
		if pressed {
			// A new key refused by Config.Overflow: rd is the count of
			// its bucket's weakest key, which must fall below half of
			// Threshold - 2 before new keys are let in.
			d.RetryAfter = l.lim.WaitBelowHalf(rd, t)
			d.Reset = d.RetryAfter
		} else {
			// 0 when it fits now (the add lost its compare-and-swaps to
			// racing writers: Stats.Contended).
			d.RetryAfter = l.lim.WaitFor(rd, wt, t)
		}
	}
	return d
}

// Stats are a Limiter's counts of the times memory or contention changed
// an answer, since New. Each is exact and only grows; take differences for
// rates. A Stats is a plain value: its zero value is a Limiter that has
// done nothing, and a copy is safe to use anywhere.
type Stats struct {
	// AdmittedUntracked counts requests admitted without being counted:
	// their key lost the lottery for a slot in a bucket full of heavier
	// keys (with OverflowAdmit, or when the weakest key of the bucket was
	// below its limit). Such a key is not limited at all while it stays
	// untracked.
	AdmittedUntracked uint64
	// Evictions counts keys whose slot a new key won in the lottery: the
	// evicted key's count is forgotten, and it is new when it returns.
	Evictions uint64
	// EvictedAtLimit counts, of Evictions, keys at their limit (a count of
	// at least half the threshold). Each can then be admitted past its
	// limit: up to its Burst again with OverflowAdmit, a quarter of it
	// with OverflowShare.
	EvictedAtLimit uint64
	// ChippedAtLimit counts lottery wins that took counts from a key at
	// its limit without evicting it (a request is one or more draws, each
	// of which may take one count): that key can be admitted past its
	// limit by what was taken. A key whose count is above one request's
	// is chipped down before it can be evicted, so with a Burst above 1
	// this, not EvictedAtLimit, is where memory pressure on keys at their
	// limit shows first. Either above 0 means NumBuckets holds fewer keys
	// than are at their limit (Config.NumBuckets).
	ChippedAtLimit uint64
	// RefusedNew counts requests of new keys refused by OverflowRefuse or
	// OverflowShare because their bucket was full of keys at their limit.
	RefusedNew uint64
	// Contended counts requests refused, though within the limit, because
	// 4 compare-and-swaps in a row on the key's bucket were lost to racing
	// writers (the package documentation, Where it can be wrong).
	Contended uint64
}

// Stats returns the Limiter's counts since New.
func (l *Limiter) Stats() Stats {
	c := admit.CountsOf(l.sk)
	return Stats{
		AdmittedUntracked: c.Untracked,
		Evictions:         c.Evictions,
		EvictedAtLimit:    c.EvictedAtLimit,
		ChippedAtLimit:    c.ChippedAtLimit,
		RefusedNew:        c.RefusedNew,
		Contended:         c.Contended,
	}
}

// Wait blocks until one request of key fits, and counts it, or until ctx
// ends: WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) error { return l.WaitN(ctx, key, 1) }

// WaitN blocks until n requests of key fit, and counts them, or until ctx
// ends. It returns nil when the requests were admitted.
//
// The callers waiting for one key are served one at a time in the order
// they called, as golang.org/x/time/rate's Wait serves them: only the
// first tries Decide, and on a refusal waits what Decision.RetryAfter
// says and tries again; the others wait for their turn. While the key has
// room (an idle key's Burst) its waiters pass as fast as Decide admits
// them. Once one is refused, the key is at its limit, and its waiters are
// released one per Per/Requests at most (a caller of n requests takes n
// such intervals), never in a batch when the count decays; a key whose
// queue is empty, its last waiter released more than that interval ago,
// starts afresh.
// Requests that do not wait (Allow, Decide) join no queue and may take
// the room first; then the waiters wait for the room again.
//
// A caller whose ctx ends leaves the queue, and the one behind it moves
// up at once: it waits no longer than it would have behind the caller
// that left. WaitN returns ctx's error if ctx ends first, and at once,
// without waiting, an error that wraps context.DeadlineExceeded if ctx's
// deadline comes before the requests could fit, counting the intervals
// of the callers ahead. At most 4,096 callers wait for one key: past them
// WaitN returns at once an error that says so, as it does if n is above
// Burst (it never fits). n <= 0 returns nil at once. The wait is on the
// wall clock, whatever Config.Clock.
//
// The queues take memory only for the callers waiting: a key's queue is
// deleted when it empties, or, at the limit, once the interval of its
// last release has passed (by the next WaitN of any key). Allow, AllowN
// and Decide take no lock for them.
func (l *Limiter) WaitN(ctx context.Context, key string, n int) error {
	if n <= 0 {
		return nil
	}
	if n > int(l.lim.Burst) {
		return fmt.Errorf("limit: WaitN(%d): more requests than the Burst of %d, which never fit", n, l.lim.Burst)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	q, w, err := l.enqueue(ctx, key, n)
	if err != nil {
		return err
	}
	defer l.leave(q, w)
	select {
	case <-w.turn:
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.serve(ctx, q, key, n)
}

// Reset forgets key's count, so that its next requests are a new key's
// (up to Burst at once): after a successful login, say, for a limit of
// failed ones. The sketch clears the key's slot; a key sharing its bucket
// and 16-bit fingerprint shares the count (THEORY.md section 3) and is
// reset with it. Requests racing with Reset are counted before it or after
// it, each whole.
func (l *Limiter) Reset(key string) { admit.Forget(l.sk, key) }

// peek is Decide for n requests (1 to Burst) without counting them: what
// Decide would answer now, read with a weight above the threshold, which
// only reads the count; Remaining is the key's now, these requests not
// taken from it.
func (l *Limiter) peek(t time.Time, key string, n int) Decision {
	if t.IsZero() {
		t = l.now()
	}
	rd, _ := l.add(t, key, l.lim.Threshold+1, l.lim.Threshold)
	wt := rate.Counts(uint64(n))
	fits := uint64(rd.Est)+uint64(wt) <= uint64(l.lim.Threshold)
	return l.decision(rd, fits, wt, n, t)
}

func (l *Limiter) now() time.Time {
	if l.clock != nil {
		return l.clock.Now()
	}
	return time.Now()
}

// noCopy makes go vet's copylocks check report copies of a Limiter.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
