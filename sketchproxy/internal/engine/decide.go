package engine

import (
	"math"
	"math/bits"
	"sync"
	"time"
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

// Verdict is a rule's decision, with what the commit, Retry-After and the
// fields need.
type Verdict struct {
	Out   Outcome
	Level float64 // (estimate + 1) / threshold of the most constrained limit
	Rule  *Rule   // nil for the per-client in-flight cap
	Limit *Limit  // the most constrained limit; nil if the rule has none
	Est   uint32  // its estimate, this request included
	Theta uint32  // its threshold
	Retry time.Duration
	Delay time.Duration // Delay: how long the tarpit holds the request
	Key   string
	// Shadow: the rule decides, logs and counts, but never refuses.
	Shadow bool
	// Each limit's estimate before this request and its threshold (the
	// new keys' factor applied), in Rule.Limits order.
	ests, thetas []uint32
	newKey       bool // first seen during a spike of new keys
	banned       bool // under a ban already: not counted
	setBan       bool // climbed past ban_above: the commit bans it
	counted      bool // Evaluate counted it already (refused: count)
	first        bool // its first request in the first limit's tick
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

// Scratch is one request's working memory: the sketch keys it builds and
// its verdicts' estimates. Reuse one per request (Reset between requests)
// and a decision allocates nothing.
type Scratch struct {
	buf  []byte
	nums []uint32
}

// Reset empties sc for the next request.
func (sc *Scratch) Reset() {
	sc.buf = sc.buf[:0]
	sc.nums = sc.nums[:0]
}

// take returns n zeroed numbers of sc's.
func (sc *Scratch) take(n int) []uint32 {
	i := len(sc.nums)
	sc.nums = append(sc.nums, make([]uint32, n)...)
	return sc.nums[i : i+n : i+n]
}

// skey builds "rule\x00limit\x00key" in buf. Limit names are letters,
// digits, - and _, so the side sketches' tags (tagBan, ...) and budgets'
// "$name" never meet a limit's key.
func skey(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0)
	buf = append(buf, b...)
	buf = append(buf, 0)
	return append(buf, key...)
}

// skey2 is skey with "$" before b, a budget's name.
func skey2(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0, '$')
	buf = append(buf, b...)
	buf = append(buf, 0)
	return append(buf, key...)
}

const (
	tagBan   = "!ban"
	tagNew   = "!new"
	tagKnown = "!known"
)

// estimate is a sketch key's count in l's sketch: this replica's, or the
// fleet's where the key is heavy enough to share.
func (e *Engine) estimate(k []byte, l *Limit, now time.Time) uint32 {
	return e.shared(k, l.sk, l.Tick, l.Theta, l.sk.EstimateBytes(k), now)
}

// shared is the fleet's count of the sketch key k whose count in this
// replica's sketch sk is local (just read), or local without a fleet.
func (e *Engine) shared(k []byte, sk Local, tick time.Duration, theta, local uint32, now time.Time) uint32 {
	if e.opts.Fleet == nil {
		return local
	}
	return e.opts.Fleet.Estimate(k, sk, tick, theta, local, now)
}

// Evaluate decides rule ru for key at now without counting the request
// (Commit does that, once every rule has decided), unless the rule counts
// refused requests: then it counts this one now, whatever the verdicts.
func (e *Engine) Evaluate(s *Set, ru *Rule, key string, now time.Time, sc *Scratch) Verdict {
	v := Verdict{Rule: ru, Key: key, Shadow: ru.Shadow}
	// A ban lasts at most 5 ticks of ban_for/4: without one that recent, no
	// key is banned, and the lookup is skipped.
	if last := e.lastBan.Load(); len(ru.Limits) > 0 && last != 0 && now.UnixNano()-last <= 8*int64(s.banTick) {
		sc.buf = skey(sc.buf, ru.Name, tagBan, key)
		v.banned = s.bans.EstimateBytes(sc.buf) > 0
	}
	active := false
	if len(ru.Limits) > 0 {
		v.ests, v.thetas = sc.take(len(ru.Limits)), sc.take(len(ru.Limits))
	}
	// A rule that counts refused requests counts this one whatever the
	// verdicts (unless it is banned): it observes now, in one pass, and
	// its estimate before this request is the one after, less it.
	v.counted = ru.CountRefused && !v.banned
	for i, l := range ru.Limits {
		sc.buf = skey(sc.buf, ru.Name, l.Name, key)
		var est uint32
		if v.counted {
			after, first := l.sk.ObserveBytesN(time.Time{}, sc.buf, l.Unit)
			after = e.shared(sc.buf, l.sk, l.Tick, l.Theta, after, now)
			est = max(after, l.Unit) - l.Unit
			if i == 0 {
				v.first = first
			}
		} else {
			est = e.estimate(sc.buf, l, now)
		}
		v.ests[i] = est
		active = active || est > 0
	}
	if len(ru.Limits) > 0 || ru.Budget != nil {
		v.newKey = e.isNewKey(s, ru, key, now, active, sc)
	}
	for i, l := range ru.Limits {
		est := v.ests[i]
		theta := l.Theta
		if v.newKey {
			theta = max(l.Unit, uint32(float64(theta)*s.nk.BudgetFactor))
		}
		v.thetas[i] = theta
		after := uint64(est) + uint64(l.Unit)
		lv := float64(after) / float64(theta)
		if v.Limit == nil || lv > v.Level {
			v.Level, v.Limit, v.Est, v.Theta = lv, l, uint32(min(after, math.MaxUint32)), theta
		}
	}
	if len(ru.Limits) > 0 {
		if u := ru.Limits[0].Unit; 2*(uint64(v.ests[0])+uint64(u)) > uint64(v.thetas[0]) {
			ru.top.Offer(key, v.ests[0]+u) // the first limit's: the TopK's clock
		}
	}
	t := &s.tarpit
	switch {
	case v.banned:
		v.Out = Ban
	case v.Limit == nil || v.Level <= 1:
		v.Out = Allow
	case !ru.Tarpit:
		v.Out = Reject
	case v.Level > t.BanAbove:
		v.Out, v.setBan = Ban, true
	case v.Level > t.RejectAbove:
		v.Out = Reject
	case v.Level > t.DripAbove:
		v.Out = Drip
	case v.Level > t.DelayAbove:
		v.Out = Delay
		span := max(t.DripAbove-t.DelayAbove, 1e-9)
		v.Delay = time.Duration(float64(t.MaxDelay) * min(1, (v.Level-t.DelayAbove)/span))
		v.Delay = max(v.Delay, 50*time.Millisecond)
	default:
		v.Out = Allow // exactly at the ladder's first step
	}
	return v
}

// Fact is one rule a request matched and the request's key under it.
// Allowlisted: the rule's allow list exempts the request (no sketch work).
type Fact struct {
	Rule        *Rule
	Key         string
	Allowlisted bool
}

// Decide decides a request's facts at once, counting no request (see
// Evaluate): a verdict for each, in vs (as long as facts), and the worst
// of those of rules not in shadow mode (Allow if none refuses). It counts
// allowlisted decisions and shadow refusals in the rules' Counts; the
// door counts the rest once it knows what became of the request (a
// delayed client may leave, a wallet may refuse).
func (e *Engine) Decide(s *Set, facts []Fact, now time.Time, sc *Scratch, vs []Verdict) (worst Verdict) {
	worst.Out = Allow
	for i := range facts {
		f := &facts[i]
		if f.Allowlisted {
			f.Rule.Counts.Count(Allowlisted, false)
			vs[i] = Verdict{Out: Allowlisted, Rule: f.Rule, Key: f.Key}
			continue
		}
		vs[i] = e.Evaluate(s, f.Rule, f.Key, now, sc)
		if v := &vs[i]; v.Shadow {
			if v.Out != Allow {
				f.Rule.Counts.Count(v.Out, true)
			}
		} else if worst.Worse(v) {
			worst = *v
		}
	}
	return worst
}

// isNewKey reports whether key counts as new: first seen while new keys
// spike, within the last window or two. A key active in one of the rule's
// limits (active) is known; otherwise the memory of keys (new_keys.remember)
// says. Rules with limits teach that memory in Commit, once per tick a key
// is active; budget-only rules here.
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

// Spiking reports whether new keys spike now, as Evaluate would judge it,
// and the meter's rate (new keys per second) and total.
func (e *Engine) Spiking(s *Set, now time.Time) (spike bool, rate float64, total uint64) {
	rate, total = e.spike.rate(now), e.spike.total.Load()
	return !s.nk.Disabled && e.spike.active(now, &s.nk) && e.warm(now, &s.nk), rate, total
}

// Commit counts v's request in its rule's limits, if it should be counted:
// every request a rule decided when the request is admitted, and a refused
// one only where the rule counts refused requests (Evaluate did). A banned
// key's attempts are not counted: the ban is its punishment. It bans the
// key if it climbed past ban_above.
func (e *Engine) Commit(s *Set, v *Verdict, admitted bool, sc *Scratch) {
	ru := v.Rule
	if ru == nil || v.Out == Allowlisted || len(v.ests) == 0 || v.banned || !admitted && !v.counted {
		return
	}
	first := v.first
	for i, l := range ru.Limits {
		if v.counted {
			break // Evaluate observed already
		}
		sc.buf = skey(sc.buf, ru.Name, l.Name, v.Key)
		_, f := l.sk.ObserveBytesN(time.Time{}, sc.buf, l.Unit)
		first = first || i == 0 && f
	}
	if first && !s.nk.Disabled {
		// Once per tick a key is active: the memory of keys grows with
		// activity, so the lottery keeps steady clients over one-off keys.
		sc.buf = skey(sc.buf, ru.Name, tagKnown, v.Key)
		s.known.ObserveBytes(sc.buf)
	}
	if v.setBan {
		sc.buf = skey(sc.buf, ru.Name, tagBan, v.Key)
		s.bans.ObserveBytesN(time.Time{}, sc.buf, 16) // 16 >> 4 ticks of ban_for/4: about ban_for
		e.lastBan.Store(e.Now().UnixNano())
	}
}

// budgetEstimate is a wallet's spend for key and the threshold that applies.
func (e *Engine) budgetEstimate(s *Set, ru *Rule, key string, newKey bool, now time.Time, sc *Scratch) (est, theta uint32) {
	b := ru.Budget
	sc.buf = skey2(sc.buf, ru.Name, b.Spec.Name, key)
	est = e.shared(sc.buf, b.sk, b.Tick, b.Theta, b.sk.EstimateBytes(sc.buf), now)
	theta = b.Theta
	if newKey {
		theta = max(b.Reserve, uint32(float64(theta)*s.nk.BudgetFactor))
	}
	return est, theta
}

// CheckBudget decides v's wallet without charging it: OverBudget if the
// cost does not fit, BudgetUnknown if the fleet cannot say and the wallet
// fails closed. ok reports that it fits.
func (e *Engine) CheckBudget(s *Set, v *Verdict, now time.Time, sc *Scratch) (refusal Verdict, ok bool) {
	ru, key := v.Rule, v.Key
	b := ru.Budget
	if f := e.opts.Fleet; f != nil {
		if closed, wait := f.WalletsClosed(); closed {
			return Verdict{Out: BudgetUnknown, Rule: ru, Key: key, Retry: wait}, false
		}
	}
	est, theta := e.budgetEstimate(s, ru, key, v.newKey, now, sc)
	held := uint64(max(0, b.Held.Get(ru.Name, key)))
	if uint64(est)+held+uint64(b.Reserve) > uint64(theta) {
		return Verdict{Out: OverBudget, Rule: ru, Key: key, Est: est, Theta: theta,
			Level: float64(est) / float64(theta)}, false
	}
	return Verdict{}, true
}

// Charge charges key's wallet in ru its cost and holds its reservation. It
// reports false when the sketch did not take the key (its bucket is full
// of bigger spenders) and the wallet does not fail open: the spend is not
// tracked, so nothing was charged or held.
func (e *Engine) Charge(ru *Rule, key string, sc *Scratch) bool {
	b := ru.Budget
	sc.buf = skey2(sc.buf, ru.Name, b.Spec.Name, key)
	b.sk.ObserveBytesN(time.Time{}, sc.buf, b.Cost)
	if b.sk.EstimateBytes(sc.buf) == 0 && !b.Spec.FailOpen {
		return false
	}
	b.Held.Add(ru.Name, key, int64(b.Reserve))
	return true
}

// Unhold gives back the reservation Charge held for key in ru's wallet.
func (e *Engine) Unhold(ru *Rule, key string) {
	b := ru.Budget
	b.Held.Add(ru.Name, key, -int64(b.Reserve))
}

// Settle charges key's wallet in ru what an upstream reported beyond the
// cost: used units in all. It returns the units charged (0 when used fits
// in the cost, or the sketch counts no more).
func (e *Engine) Settle(ru *Rule, key string, used uint64) uint64 {
	b := ru.Budget
	usedC := (used-1)/b.Spec.Unit + 1 // rounded up; used >= 1 here or below
	if used == 0 {
		usedC = 0
	}
	usedC = min(usedC, math.MaxUint32) * uint64(b.Scale)
	if usedC <= uint64(b.Cost) {
		return 0
	}
	extra := uint32(min(usedC-uint64(b.Cost), math.MaxUint32))
	buf := skey2(nil, ru.Name, b.Spec.Name, key)
	before := b.sk.EstimateBytes(buf)
	after, _ := b.sk.ObserveBytesN(time.Time{}, buf, extra)
	if after > before {
		return uint64(after-before) / uint64(b.Scale) * b.Spec.Unit
	}
	return 0
}

// RetryAll is how long a refused client must wait before its next request
// is let through by every rule it matches: the longest wait over every
// limit (with what this request added), every ban and every wallet, so
// that waiting Retry-After is always enough (for a client that sends
// nothing meanwhile).
func (e *Engine) RetryAll(s *Set, vs []Verdict, now time.Time, sc *Scratch) time.Duration {
	var d time.Duration
	for i := range vs {
		v := &vs[i]
		if v.Rule == nil || v.Out == Allowlisted || v.Shadow {
			continue
		}
		ru := v.Rule
		for j, l := range ru.Limits {
			sc.buf = skey(sc.buf, ru.Name, l.Name, v.Key)
			est := e.estimate(sc.buf, l, now)
			if uint64(est)+uint64(l.Unit) > uint64(v.thetas[j]) {
				d = max(d, RetryAfter(est, l.Unit, v.thetas[j], now, l.Tick))
			}
		}
		if len(ru.Limits) > 0 {
			sc.buf = skey(sc.buf, ru.Name, tagBan, v.Key)
			if ban := s.bans.EstimateBytes(sc.buf); ban > 0 {
				d = max(d, RetryAfter(ban, 1, 1, now, s.banTick))
			}
		}
		if b := ru.Budget; b != nil {
			// Reservations of requests in flight may all be spent: wait as
			// if they were (in-flight requests end when they end).
			est, theta := e.budgetEstimate(s, ru, v.Key, v.newKey, now, sc)
			need := min(uint64(theta), uint64(b.Reserve)+uint64(max(0, b.Held.Get(ru.Name, v.Key))))
			if uint64(est)+need > uint64(theta) {
				d = max(d, RetryAfter(est, uint32(need), theta, now, b.Tick))
			}
		}
	}
	return d
}

// Status is what the RateLimit field says of limit l for a key whose
// estimate is est against theta, before a next request of add counts: r,
// the requests that still fit at once, and t, the time until more quota
// (the next halving); over when add does not fit now, and then r is 0 and
// t the time until it fits.
func Status(l *Limit, est, theta, add uint32, now time.Time) (r int64, t time.Duration, over bool) {
	r = (int64(theta) - int64(est)) / int64(l.Unit)
	t = UntilNextTick(now, l.Tick)
	if over = uint64(est)+uint64(add) > uint64(theta); over {
		r = 0
		t = RetryAfter(est, add, theta, now, l.Tick)
	}
	return max(r, 0), t, over
}

// Fields are the values of the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, and of the legacy X-RateLimit-*
// fields (which describe the most constrained limit).
type Fields struct {
	Policy    string
	RateLimit string // "" on a refusal that no limit explains (a wallet's, a ban's)
	// Legacy: X-RateLimit-Limit, -Remaining and -Reset.
	LegacyLimit, LegacyRemaining, LegacyReset int64
}

// Fields returns the fields for every limit of every rule that decided the
// request (shadow rules send none), and false when there are none. Each
// policy's quota is whole requests q per whole seconds w; for each, its
// remaining r (never above q) and t, the seconds until more quota. On a
// refusal the RateLimit field lists only the policies the client is over,
// each with its own wait as t, so that Retry-After (the longest wait) is
// never earlier than a t.
func (e *Engine) Fields(vs []Verdict, refused bool, now time.Time, sc *Scratch) (Fields, bool) {
	var f Fields
	var cur []byte
	rules := 0
	var level float64
	legacy := false
	for i := range vs {
		v := &vs[i]
		if v.Rule == nil || v.Shadow || v.Out == Allowlisted || len(v.ests) == 0 {
			continue
		}
		if rules++; rules == 1 {
			f.Policy = v.Rule.Policy
		} else {
			f.Policy += ", " + v.Rule.Policy
		}
		for j, l := range v.Rule.Limits {
			est := v.ests[j]
			if refused {
				sc.buf = skey(sc.buf, v.Rule.Name, l.Name, v.Key)
				est = e.estimate(sc.buf, l, now)
			} else if !v.banned {
				est += l.Unit // this request, counted
			}
			theta := v.thetas[j]
			r, wait, over := Status(l, est, theta, l.Unit, now)
			r, t := min(r, l.Q), Seconds(wait)
			if !refused || over {
				if cur == nil {
					cur = make([]byte, 0, 48*len(v.Rule.Limits))
				}
				cur = AppendItem(cur, l.Quoted, r, t)
			}
			if lv := float64(est) / float64(theta); !legacy || lv > level {
				f.LegacyLimit, f.LegacyRemaining, f.LegacyReset, level, legacy = l.Q, r, t, lv, true
			}
		}
	}
	f.RateLimit = string(cur)
	return f, rules > 0
}

// Hits is one limit's check of n requests at once, as Envoy's descriptors
// ask (hits_addend): the estimate before them and the threshold, in
// counts, and the counts they add.
type Hits struct {
	Est, Theta, Add uint32
	// Over: they do not fit now. Never: they would not fit at an
	// estimate of 0 (more than the whole limit).
	Over, Never bool
}

// CheckHits checks n requests of key against ru's limit l, counting
// nothing. A key first seen during a spike of new keys gets the new keys'
// share of the limit, as in Evaluate.
func (e *Engine) CheckHits(s *Set, ru *Rule, l *Limit, key string, n uint32, now time.Time, sc *Scratch) Hits {
	sc.buf = skey(sc.buf, ru.Name, l.Name, key)
	h := Hits{Est: e.estimate(sc.buf, l, now), Theta: l.Theta}
	if e.isNewKey(s, ru, key, now, h.Est > 0, sc) {
		h.Theta = max(l.Unit, uint32(float64(h.Theta)*s.nk.BudgetFactor))
	}
	units := uint64(n) * uint64(l.Unit)
	h.Add = uint32(min(units, 2*MaxThreshold+2))
	h.Over = uint64(h.Est)+units > uint64(h.Theta)
	h.Never = units > uint64(h.Theta)
	return h
}

// CountHits counts h's requests of key in ru's limit l, and returns the
// estimate with them. As Commit, it teaches the memory of keys once per
// tick a key is active.
func (e *Engine) CountHits(s *Set, ru *Rule, l *Limit, key string, h *Hits, sc *Scratch) uint32 {
	sc.buf = skey(sc.buf, ru.Name, l.Name, key)
	if _, first := l.sk.ObserveBytesN(time.Time{}, sc.buf, h.Add); first && !s.nk.Disabled {
		sc.buf = skey(sc.buf, ru.Name, tagKnown, key)
		s.known.ObserveBytes(sc.buf)
	}
	return uint32(min(uint64(h.Est)+uint64(h.Add), math.MaxUint32))
}

// WalletLocks makes a wallet's check and its charge one step for each
// (rule, key): 64 mutexes, a wallet's chosen by its cell in the budget's
// held counts (the seeded hash of its rule and key). A request locks the
// stripes of all its wallets at once, in ascending order, so two requests
// with wallets in common cannot deadlock.
type WalletLocks [64]sync.Mutex

// Lock locks the stripes of the wallets among vs and returns them as a
// mask, for Unlock.
func (l *WalletLocks) Lock(vs []Verdict) uint64 {
	var mask uint64
	for i := range vs {
		if v := &vs[i]; v.Rule != nil && v.Rule.Budget != nil && v.Out != Allowlisted {
			cell, _ := v.Rule.Budget.Held.Idx(v.Rule.Name, v.Key)
			mask |= 1 << (cell & 63)
		}
	}
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Lock()
	}
	return mask
}

// Unlock unlocks the stripes Lock locked.
func (l *WalletLocks) Unlock(mask uint64) {
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Unlock()
	}
}

// Estimate is key's count in ru's limit l now, in requests (rounded
// down): this replica's, or the fleet's for a key heavy enough to share.
func (e *Engine) Estimate(ru *Rule, l *Limit, key string) uint32 {
	k := skey(nil, ru.Name, l.Name, key)
	return e.estimate(k, l, e.Now()) / l.Unit
}

// Spent is what key has spent of ru's wallet, in units (this replica's
// count).
func (e *Engine) Spent(ru *Rule, key string) uint64 {
	b := ru.Budget
	return uint64(b.sk.EstimateBytes(skey2(nil, ru.Name, b.Spec.Name, key))) / uint64(b.Scale) * b.Spec.Unit
}
