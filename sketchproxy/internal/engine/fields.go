package engine

import (
	"math"
	"math/bits"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

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
	est, _, _ := e.estimate(skey(nil, ru.Name, l.Name, key), l, 0, e.Now())
	return est / rate.Unit
}
