package engine

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Outcome is what happened to a request under one rule.
type Outcome uint8

// The outcomes, least severe first.
const (
	Allow         Outcome = iota
	Allowlisted           // the rule's allow list: no sketch work
	Delay                 // held, then proxied
	Drip                  // a 429 dripped slowly; never proxied
	TarpitFull            // over the limit with the tarpit at its caps: an immediate 429
	InFlight              // the key has max_in_flight requests running: 429
	BudgetUnknown         // the wallet cannot be tracked: 503 (fail closed)
	OverBudget            // the wallet is spent: 429
	Reject                // over the limit: 429
	Ban                   // far over the limit: 429 and Connection: close until the ban ends
	NumOutcomes
)

var outcomeNames = [...]string{"allow", "allowlisted", "delay", "drip", "tarpit_full", "in_flight", "budget_unknown", "over_budget", "reject", "ban"}

func (o Outcome) String() string { return outcomeNames[o] }

// Refuses reports whether o keeps a request from going on.
func (o Outcome) Refuses() bool { return o != Allow && o != Allowlisted && o != Delay }

// Verdict is one rule's decision on one request, with what the count, the
// wait and the fields need.
type Verdict struct {
	Out   Outcome
	Level float64 // (count + this request) / threshold of the most constrained limit
	Rule  *Rule   // nil for the per-client cap of requests in progress
	Limit *Limit  // the most constrained limit; nil if the rule has none
	Est   uint32  // its count with this request's hits
	Theta uint32  // its threshold (the new keys' share applied)
	// Retry is a refusal's own wait, where no count says it: a wallet's
	// fleet wait, an in-flight place. A shadow verdict that would have
	// refused gets the whole wait its refusal would have had (Never where
	// none is enough), for its log line.
	Retry time.Duration
	Delay time.Duration // Delay: how long the tarpit holds the request
	Key   string
	// Shadow: the rule decides, logs and counts, but never refuses.
	Shadow bool
	// Over: the request's hits do not fit in some limit now. Never: they
	// would not fit at a count of 0 (more than a whole limit, or a rule
	// that blocks every hit): no wait is enough.
	Over, Never bool
	// Quota: the fact was one quota among the request's (Fact.Quota).
	Quota bool

	// Per limit, in Rule.Limits order (slices of the Scratch): the count
	// now (this request's hits included once counted), the threshold
	// (the new keys' share applied), and the part of the count that other
	// replicas hold (a fleet's).
	ests, thetas, others []uint32
	// ceils and holds: per limit, the fleet's ceiling on the local count
	// (0: none; Answer.Ceiling), and the room it holds for the request,
	// to settle once it is counted or refused (0: none; Answer.Hold,
	// Fleet.Settle). held: some hold is not settled yet.
	ceils, holds []uint32
	held         bool
	// tell: bit i asks that the fleet be told once limit i counts the
	// request (Fleet.Counted); tellBudget, once its wallet is charged.
	tell       uint64
	tellBudget bool
	add        uint32 // the counts the request's hits add to each limit
	hits       uint32 // the hits its decision counts (Fact.hits)
	noCount    bool   // Fact.ZeroHits or Fact.Negative: never counted
	newKey     bool   // first seen during a spike of new keys
	banned     bool   // under a ban already: not counted
	setBan     bool   // climbed past ban_above: banned once decided
	counted    bool   // evaluate counted it already (refused: count)
	first      bool   // its first request in the first limit's tick
}

// Worse reports whether o is a worse outcome for the request than v: a
// more severe outcome, or the same one at a higher level. Allowlisted is
// never worse.
func (v *Verdict) Worse(o *Verdict) bool {
	if o.Out != v.Out {
		return o.Out > v.Out && o.Out != Allowlisted
	}
	return o.Level > v.Level
}

// before is limit i's count before this request's hits.
func (v *Verdict) before(i int) uint32 {
	if v.counted {
		return v.ests[i] - min(v.ests[i], v.add)
	}
	return v.ests[i]
}

// Fields are the values of the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, and of the legacy X-RateLimit-*
// fields (which describe the most constrained limit).
type Fields struct {
	// Any: some limit decided the request, so the fields apply.
	Any    bool
	Policy string
	// RateLimit is the RateLimit field, in the request's Scratch; empty on
	// a refusal that no limit explains (a wallet's, a ban's).
	RateLimit []byte
	// Legacy: X-RateLimit-Limit, -Remaining and -Reset.
	LegacyLimit, LegacyRemaining, LegacyReset int64
}

// fields returns the fields for every limit of every rule that decided the
// request (shadow rules send none). Each policy's quota is whole requests
// q per whole seconds w; for each, its remaining r (never above q) and t,
// the seconds until more quota. On a refusal the RateLimit field lists
// only the policies the client is over (but quotas, which refuse
// nothing), each with its own wait as t, so that Retry-After (the longest
// wait) is never earlier than a t; a limit no wait can satisfy (more hits
// than it holds) gets no item.
//
// t is reckoned from the count as the sketch answered it (rate.Status:
// never short); on a refusal it is at most retry, the refusal's
// Retry-After, reckoned to the nanosecond.
func (e *Engine) fields(vs []Verdict, refused bool, retry time.Duration, now time.Time, sc *Scratch) Fields {
	var f Fields
	var level float64 // the legacy fields' limit's: the most constrained
	legacy := false
	var policy []byte      // the policies of a second rule on, joined
	var best map[*Rule]int // for many verdicts (showsVerdict)
	if len(vs) > 8 {
		best = bestOfRules(vs)
	}
	b := sc.field[:0]
	for i := range vs {
		v := &vs[i]
		if !showsVerdict(vs, i, best) {
			continue
		}
		switch {
		case !f.Any:
			f.Policy = v.Rule.Policy
		case policy == nil:
			policy = append(append(append(policy, f.Policy...), ", "...), v.Rule.Policy...)
		default:
			policy = append(append(policy, ", "...), v.Rule.Policy...)
		}
		f.Any = true
		add := uint32(rate.Unit) // a next request
		if refused {
			add = v.add // when these hits fit
		}
		for j, l := range v.Rule.Limits {
			rl := l.Limit
			rl.Threshold = v.thetas[j]
			est := v.ests[j]
			r, t, over := rl.Status(est, add, now)
			if refused && retry > 0 {
				t = min(t, retry)
			}
			r, secs := min(r, rl.Q), rate.Seconds(t)
			if (!refused || over && !v.Quota) && add <= rl.Threshold {
				b = rate.AppendItem(b, l.Quoted, r, secs)
			}
			if lv := float64(est) / float64(rl.Threshold); !legacy || lv > level {
				f.LegacyLimit, f.LegacyRemaining, f.LegacyReset, level, legacy = rl.Q, r, secs, lv, true
			}
		}
	}
	if policy != nil {
		f.Policy = string(policy)
	}
	sc.field = b
	f.RateLimit = b
	return f
}

// showsVerdict reports whether the fields show verdict i: a verdict with
// limits of a rule that is not in shadow mode, and, of several verdicts of
// one rule (an Envoy call with two values of one descriptor), only the
// most constrained, so that each policy is listed once. best, for many
// verdicts, is bestOfRules's: linear, so that a call of 40,000
// descriptors costs what they cost; a few are compared pairwise.
func showsVerdict(vs []Verdict, i int, best map[*Rule]int) bool {
	if !fieldsOf(&vs[i]) {
		return false
	}
	if best != nil {
		return best[vs[i].Rule] == i
	}
	for j := range vs {
		if j != i && vs[j].Rule == vs[i].Rule && fieldsOf(&vs[j]) && moreConstrained(vs, j, i) {
			return false
		}
	}
	return true
}

// bestOfRules is each rule's most constrained verdict with fields.
func bestOfRules(vs []Verdict) map[*Rule]int {
	best := map[*Rule]int{}
	for i := range vs {
		if !fieldsOf(&vs[i]) {
			continue
		}
		if j, ok := best[vs[i].Rule]; !ok || moreConstrained(vs, i, j) {
			best[vs[i].Rule] = i
		}
	}
	return best
}

// fieldsOf reports whether a verdict has fields to show: not one of a
// shadow rule. A request decided in shadow mode as a whole
// (Request.Shadow: Envoy's global shadow_mode) still shows its rules'
// fields, as they would be enforced, as envoyproxy/ratelimit's headers
// do there.
func fieldsOf(v *Verdict) bool {
	return v.Rule != nil && !v.Rule.Shadow && v.Out != Allowlisted && len(v.ests) > 0
}

// moreConstrained orders verdicts of one rule: the higher level, then the
// first.
func moreConstrained(vs []Verdict, i, j int) bool {
	return vs[i].Level > vs[j].Level || vs[i].Level == vs[j].Level && i < j
}

// Status is what a verdict's first limit says to a client, as Envoy's
// descriptor statuses give it: the requests remaining and the time until
// more quota; for a verdict over, 0 and the time until its hits fit.
func (v *Verdict) Status(now time.Time) (remaining int64, reset time.Duration) {
	if len(v.ests) == 0 {
		return 0, 0
	}
	add := uint32(rate.Unit)
	if v.Over {
		add = v.add
	}
	rl := v.Rule.Limits[0].Limit
	rl.Threshold = v.thetas[0]
	r, t, over := rl.Status(v.ests[0], add, now)
	if over {
		t, _ = v.exactWait(0, &rl, add, t, now, nil) // as Retry-After reckons it
	}
	return r, t
}

// exactWait refines w, the wait of v's limit j (compiled as rl) until add
// more counts fit, reckoned from the count the sketch answered, to the
// nanosecond: from the count as the sketch holds it, behind the rounded
// one, so that a client that comes back a second before Retry-After is
// refused. A count shared with a fleet, or one that halves, keeps w. It
// returns the buffer it built the sketch key in, for reuse.
func (v *Verdict) exactWait(j int, rl *rate.Limit, add uint32, w time.Duration, now time.Time, buf []byte) (time.Duration, []byte) {
	if w <= 0 || v.others[j] != 0 || rl.Halving() {
		return w, buf
	}
	l := v.Rule.Limits[j]
	buf = skey(buf, v.Rule.Name, l.Name, v.Key)
	rd := l.sk.ReadBytes(time.Time{}, buf)
	if rd.Est > v.ests[j] {
		// Counts the verdict leaves out (a shadow rule's wait reckoned as
		// an enforced rule's, without this request), added in this very
		// step: taken out as they went in.
		rd.Raw -= min(rd.Raw, (rd.Est-v.ests[j])*rd.Scale())
		rd.Est = v.ests[j]
	}
	return rl.WaitFor(rd, add, now), buf
}

// Left is the verdict's first limit in package limit's words (its
// Decision): the requests the key may still send at once, after this
// request where it was counted, and the time to the next tick.
func (v *Verdict) Left(now time.Time) (remaining int64, reset time.Duration) {
	if len(v.ests) == 0 {
		return 0, 0
	}
	rl := v.Rule.Limits[0].Limit
	rl.Threshold = v.thetas[0]
	return rl.Remaining(v.ests[0]), rl.Reset(v.ests[0], now)
}

// forever is a wait no client can sit out.
const forever = time.Duration(math.MaxInt64)

// retryAll is how long a refused client must wait before its next request
// is let through by every rule it matches: the longest wait over every
// limit (with what this request added), every ban and every wallet, so
// that waiting Retry-After is always enough (for a client that sends
// nothing meanwhile). never: some wait is forever. Shadow rules and
// quotas, which never refuse, are not waited for.
func (e *Engine) retryAll(s *Set, vs []Verdict, now time.Time, sc *Scratch) (d time.Duration, never bool) {
	for i := range vs {
		v := &vs[i]
		if v.Rule == nil || v.Out == Allowlisted || v.Shadow || v.Quota {
			continue
		}
		d = max(d, e.waitFor(s, v, now, sc))
	}
	return d, d == forever
}

// waitFor is how long v's key waits before its hits fit in every limit,
// ban and wallet of its rule: forever if they never fit.
func (e *Engine) waitFor(s *Set, v *Verdict, now time.Time, sc *Scratch) time.Duration {
	ru := v.Rule
	if v.Never {
		return forever
	}
	var d time.Duration
	for j, l := range ru.Limits {
		rl := l.Limit
		rl.Threshold = v.thetas[j]
		var w time.Duration
		w, sc.buf = v.exactWait(j, &rl, v.add, rl.Wait(v.ests[j], v.add, now), now, sc.buf)
		d = max(d, w)
	}
	if len(ru.Limits) > 0 {
		sc.buf = skey(sc.buf, ru.Name, tagBan, v.Key)
		if ban := s.bans.EstimateBytes(sc.buf); ban > 0 {
			d = max(d, rate.UntilTick(now, s.banTick, int64(bits.Len32(ban))))
		}
	}
	if b := ru.Budget; b != nil {
		// Reservations of requests in flight may all be spent: wait as
		// if they were (in-flight requests end when they end).
		est, theta, _ := e.budgetEstimate(s, ru, v.Key, v.newKey, 0, now, sc)
		need := min(uint64(theta), uint64(b.Reserve)+uint64(max(0, b.Held.Get(ru.Name, v.Key))))
		rl := b.Lim
		rl.Threshold = theta
		d = max(d, rl.Wait(est, uint32(need), now))
	}
	return d
}

// Estimate is key's count in ru's limit l now, in requests (rounded
// down): this replica's, or the fleet's for a key heavy enough to share.
func (e *Engine) Estimate(ru *Rule, l *Limit, key string) uint32 {
	est, _, _ := e.estimate(skey(nil, ru.Name, l.Name, key), l, 0, false, e.Now(), nil)
	return est / rate.Unit
}

// Scratch is one request's working memory: the sketch keys it builds, its
// verdicts and their counts, the places it holds and the RateLimit field.
// Reuse one per request (Reset once the request is done, after
// Decision.Done) and a decision allocates nothing.
type Scratch struct {
	buf      []byte
	nums     []uint32
	verdicts []Verdict
	places   []place
	field    []byte
	// start is when the request first waited on the network, for a
	// fleet's claim (Query.Start).
	start time.Time
}

// Reset empties sc for the next request.
func (sc *Scratch) Reset() {
	sc.buf = sc.buf[:0]
	sc.nums = sc.nums[:0]
	clear(sc.verdicts) // no rule or key outlives its request
	sc.verdicts = sc.verdicts[:0]
	clear(sc.places)
	sc.places = sc.places[:0]
	sc.field = sc.field[:0]
	sc.start = time.Time{}
}

// take returns n zeroed numbers of sc's.
func (sc *Scratch) take(n int) []uint32 { return grow(&sc.nums, n) }

// takeVerdicts returns n zeroed verdicts of sc's.
func (sc *Scratch) takeVerdicts(n int) []Verdict { return grow(&sc.verdicts, n) }

// grow extends *s by n zeroed elements and returns them: no allocation
// once *s has the room (append of a make allocates under -race).
func grow[T any](s *[]T, n int) []T {
	i := len(*s)
	*s = slices.Grow(*s, n)[:i+n]
	clear((*s)[i:])
	return (*s)[i : i+n : i+n]
}

// skey builds "rule\x00limit\x00key" in buf. Limit names are letters,
// digits, - and _, so the side sketches' tags (tagBan, ...) and budgets'
// "$name" never meet a limit's key.
func skey(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0)
	buf = append(buf, b...)
	return appendKey(buf, key)
}

// skey2 is skey with "$" before b, a budget's name.
func skey2(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0, '$')
	buf = append(buf, b...)
	return appendKey(buf, key)
}

// MaxKey is the longest key a sketch key holds as it is; a longer one (a
// padded header, a 5,000-byte descriptor value) stands as its SHA-256, so
// that a key costs the same whatever a client sends, and the fleet's hot
// set holds at most this much of each.
const MaxKey = 128

// appendKey appends the separator and key to buf: 0 and the key as it is,
// or 1 and its digest if it is longer than MaxKey (no short key's sketch
// key has a 1 there, so no client can send a digest as its key).
func appendKey(buf []byte, key string) []byte {
	if len(key) <= MaxKey {
		buf = append(buf, 0)
		return append(buf, key...)
	}
	sum := sha256.Sum256([]byte(key))
	buf = append(buf, 1)
	return append(buf, sum[:]...)
}

const (
	tagBan    = "!ban"
	tagNew    = "!new"
	tagKnown  = "!known"
	tagProven = "!proven"
)

// Counts counts a rule's decisions by outcome, real and shadow, and their
// hits (Fact.Hits: one a decision, Envoy's hits_addend; none for ZeroHits
// and Negative), the admitted requests that left their key near its limit,
// and the refusals of each of its limits, by the limit's name.
type Counts struct {
	n      [NumOutcomes][2]atomic.Uint64
	hits   [NumOutcomes][2]atomic.Uint64
	near   atomic.Uint64
	limits sync.Map // limit name → *atomic.Uint64: the refusals it decided
}

// refusedBy counts a refusal that limit decided.
func (c *Counts) refusedBy(limit string) {
	n, ok := c.limits.Load(limit)
	if !ok {
		n, _ = c.limits.LoadOrStore(limit, new(atomic.Uint64))
	}
	n.(*atomic.Uint64).Add(1)
}

// Limits calls f with each limit's refusals, in no order.
func (c *Counts) Limits(f func(limit string, refused uint64)) {
	c.limits.Range(func(k, v any) bool {
		f(k.(string), v.(*atomic.Uint64).Load())
		return true
	})
}

// Near is how many admitted requests left their key above
// NearLimitNum/NearLimitDen of its limit.
func (c *Counts) Near() uint64 { return c.near.Load() }

// Count counts one decision of hits hits.
func (c *Counts) Count(o Outcome, shadow bool, hits uint32) {
	i := 0
	if shadow {
		i = 1
	}
	c.n[o][i].Add(1)
	c.hits[o][i].Add(uint64(hits))
}

// Get returns the count of o.
func (c *Counts) Get(o Outcome, shadow bool) uint64 {
	i := 0
	if shadow {
		i = 1
	}
	return c.n[o][i].Load()
}

// Hits returns the hits of o's decisions.
func (c *Counts) Hits(o Outcome, shadow bool) uint64 {
	i := 0
	if shadow {
		i = 1
	}
	return c.hits[o][i].Load()
}

// LogLimiter lets a door log at most a number of lines (refusals, failed
// settlements) each second of the clock, and counts the lines it held
// back, so that the next line can say how many were left out. The zero
// LogLimiter is ready; it is safe for concurrent use.
type LogLimiter struct {
	sec, n, skipped atomic.Int64
}

// Allow reports whether a line at now may be logged, at most max a
// second; when it may, skipped is how many were held back since the last
// line logged.
func (l *LogLimiter) Allow(now time.Time, max int64) (ok bool, skipped int64) {
	s := now.Unix()
	if old := l.sec.Load(); old != s && l.sec.CompareAndSwap(old, s) {
		l.n.Store(0)
	}
	if l.n.Add(1) > max {
		l.skipped.Add(1)
		return false, 0
	}
	return true, l.skipped.Swap(0)
}

// Label is a key as logs and metrics show it: "k:" and the first 12 hex
// digits of its HMAC-SHA256 under secret. A key is a client address, an API
// key or a token: none of them appears whole, and no byte a client chose
// reaches a log line or a label.
func Label(secret []byte, key string) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	var sum [32]byte
	return "k:" + hex.EncodeToString(mac.Sum(sum[:0])[:6])
}
