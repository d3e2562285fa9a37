package engine

import (
	"context"
	"math"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Request is what a door knows of one request: the rules it matched with
// its key under each, and what the door can do.
type Request struct {
	Facts []Fact
	// Client is the client's address (grouped by prefix) and ClientCap
	// the most requests in progress it may have (0: no cap): the
	// proxy's server.max_in_flight_per_client, over all rules.
	Client    string
	ClientCap int
	// NoDrip: the door answers at once (a forward-auth check, a gRPC
	// call), so a refusal the tarpit would drip is refused at once.
	NoDrip bool
	// Shadow decides every fact in shadow mode: nothing is refused, and
	// every hit is counted (Envoy's global shadow mode). The fields still
	// describe the limits as they would be enforced.
	Shadow bool
}

// Fact is one rule a request matched and the request's key under it.
type Fact struct {
	Rule *Rule
	Key  string
	// Hits is how many requests the fact counts (0 means 1): Envoy's
	// hits_addend.
	Hits uint32
	// ZeroHits: the fact counts nothing and is judged as is (Envoy's
	// hits_addend of 0 on a descriptor). Negative: it is never over and
	// counts nothing (Envoy's is_negative_hits).
	ZeroHits, Negative bool
	// Allowlisted: the rule's allow list exempts the request (no sketch
	// work).
	Allowlisted bool
	// Quota makes the fact a quota (Envoy's quota_mode): it is judged and
	// counted like any other, but never refuses the request; the door
	// reports that it is over.
	Quota bool
}

// hits is what the fact's decision counts in its rule's Counts: its hits
// (0 means 1), none for ZeroHits and Negative, which add nothing to a
// count.
func (f *Fact) hits() uint32 {
	if f.ZeroHits || f.Negative {
		return 0
	}
	return max(f.Hits, 1)
}

// Decision is everything a door needs to answer a request, and what the
// request holds until it ends. Its slices live in the request's Scratch.
type Decision struct {
	// Admitted: the request goes on. Then it is counted in every limit,
	// its wallets are charged, and it holds its in-flight places until
	// Done.
	Admitted bool
	// Gone: the client went away while the tarpit held it; there is
	// nothing to answer.
	Gone bool
	// Worst is the refusal (Admitted false), or the most constrained of
	// the verdicts that admitted it (Allow or Delay).
	Worst Verdict
	// Verdicts are the facts' verdicts, in order: shadow ones that refuse
	// are for the log.
	Verdicts []Verdict
	// Retry is a refusal's Retry-After, at least a second, covering every
	// limit, ban and wallet the request matched; Never when no wait is
	// enough (Retry is then 0). Wait is that wait itself, before the
	// floor of a second (for a caller that sleeps rather than answers).
	Retry, Wait time.Duration
	Never       bool
	// Drip: the door drips the refusal slowly (the tarpit); a place is
	// held for it until Done.
	Drip bool
	// Fields are the RateLimit-Policy and RateLimit fields (Fields).
	Fields Fields
	// Wallets are the charged wallets of an admitted request, to settle
	// with what the upstream reports.
	Wallets []*Wallet

	e      *Engine
	client string  // the client whose place is held, if held
	held   bool    // a client's place is held
	places []place // in-flight and tarpit places, in the Scratch
	worst  int     // the index of Worst's verdict; -1 for none
}

// Close reports whether the connection should close after the answer: a
// ban's.
func (d *Decision) Close() bool { return d.Worst.Out == Ban }

// Unavailable reports whether the refusal is not the client's doing: a
// wallet that cannot be tracked and fails closed (503, not 429).
func (d *Decision) Unavailable() bool { return d.Worst.Out == BudgetUnknown }

// place is something a request holds until it ends: an in-flight place of
// a rule, or a tarpit's hold of a dripped refusal.
type place struct {
	t         *Tally
	rule, key string
	tarpit    bool
}

// Done releases what the request holds: its client's place, its in-flight
// places, a drip's hold, and every wallet's reservation that the door did
// not Keep. Call it once the request ends (after the upstream's answer, or
// after the refusal is written). It is safe to call more than once.
func (d *Decision) Done() {
	if d.e == nil {
		return
	}
	e := d.e
	if d.held {
		e.clients.Add("", d.client, -1)
	}
	for _, p := range d.places {
		if p.tarpit {
			e.release(p.rule, p.key)
		} else {
			p.t.Add(p.rule, p.key, -1)
		}
	}
	for _, w := range d.Wallets {
		w.releaseUnlessKept()
	}
	d.e, d.held, d.places = nil, false, nil
}

// Decide is the one call that decides a request at now, for every door.
// It evaluates each fact's rule, holds a delayed request in the tarpit
// (sleeping until its delay passes or ctx ends: the client went away),
// checks the wallets
// and the in-flight caps, counts an admitted request in every limit (each
// a conditional add: a limit that racing requests filled in the meantime
// refuses it rather than let it pass), charges its wallets, counts every
// rule's outcome, and computes Retry-After and the fields. A refused
// request is counted only by rules that count refused requests.
//
// The door answers from the Decision and calls Done when the request ends.
func (e *Engine) Decide(ctx context.Context, s *Set, now time.Time, rq *Request, sc *Scratch) Decision {
	d := Decision{e: e, worst: -1, Admitted: true}
	d.Worst.Out = Allow
	if rq.ClientCap > 0 {
		// The Tally's copy of the client, not rq's: nothing of rq outlives
		// the call, so a door's facts stay on its stack.
		own, ok := e.clients.acquire("", rq.Client, rq.ClientCap)
		if !ok {
			d.Admitted = false
			d.Worst = Verdict{Out: InFlight, Retry: time.Second}
			d.Retry = time.Second // a place frees when a request ends: no promise
			return d
		}
		d.client, d.held = own, true
	}
	d.Verdicts = sc.takeVerdicts(len(rq.Facts))
	e.evaluateAll(s, now, rq, sc, &d)
	if d.Admitted && d.Worst.Out == Delay {
		e.holdDelayed(ctx, s, &d)
	}
	if d.Admitted {
		e.admit(s, now, sc, &d)
	}
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.held {
			e.unhold(v, sc) // not counted: refused, or gone while held
		}
		e.afterCount(s, &d.Verdicts[i], sc)
	}
	if d.Gone {
		d.places = sc.places
		return d // nothing to answer: the client went away while held
	}
	if !d.Admitted {
		e.refusal(s, now, rq.NoDrip, sc, &d)
	}
	e.shadowWaits(s, now, sc, &d)
	e.countOutcomes(&d)
	d.Fields = e.fields(d.Verdicts, !d.Admitted, d.Retry, now, sc)
	d.places = sc.places
	return d
}

// evaluateAll evaluates every fact into d.Verdicts and finds the worst of
// the verdicts that may refuse (not in shadow mode, not a quota).
func (e *Engine) evaluateAll(s *Set, now time.Time, rq *Request, sc *Scratch, d *Decision) {
	allow := Verdict{Out: Allow}
	worst := &allow
	for i := range rq.Facts {
		f := &rq.Facts[i]
		v := &d.Verdicts[i]
		if f.Allowlisted {
			*v = Verdict{Out: Allowlisted, Rule: f.Rule, Key: f.Key, hits: f.hits()}
			f.Rule.Counts.Count(Allowlisted, false, v.hits)
			continue
		}
		e.evaluate(s, f, now, sc, v)
		v.Shadow = v.Shadow || rq.Shadow
		switch {
		case v.Shadow:
			if v.Out != Allow {
				f.Rule.Counts.Count(v.Out, true, v.hits)
			}
		case v.Quota: // never refuses; counted as decided (countOutcomes)
		case worst.Worse(v):
			worst, d.worst = v, i
		}
	}
	d.Worst = *worst
	d.Admitted = !d.Worst.Out.Refuses()
}

// holdDelayed holds a request the tarpit delays for its delay, before
// anything is reserved or charged: a client that leaves while held costs
// nothing (its attempt is counted already, as every attempt of a tarpit
// rule is), and the decision is Gone. With the tarpit's caps full it is
// refused at once.
func (e *Engine) holdDelayed(ctx context.Context, s *Set, d *Decision) {
	w := &d.Worst
	if !e.hold(w.Rule.Name, w.Key, &s.tarpit) {
		w.Out, d.Admitted = TarpitFull, false
		return
	}
	err := e.opts.Sleep(ctx, w.Delay)
	e.release(w.Rule.Name, w.Key)
	if err != nil {
		w.Rule.Counts.Count(Delay, false, w.hits)
		d.Admitted, d.Gone = false, true
	}
}

// admit reserves and counts an admitted request: its wallets' room and its
// in-flight places, then its hits in every limit, then its wallets'
// charges. The first of them that fails refuses the request; what was
// reserved is given back (a limit counted before a later one refused
// stays counted: the safe direction).
func (e *Engine) admit(s *Set, now time.Time, sc *Scratch, d *Decision) {
	// From a wallet's check to its charge, no other request may check the
	// same wallet: two that both saw room for one more reservation would
	// both take it, past the budget.
	if s.wallets {
		locked := e.wallets.Lock(d.Verdicts)
		defer e.wallets.Unlock(locked)
	}
	var charged [8]int
	toCharge := charged[:0]
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if v.Out == Allowlisted {
			continue
		}
		if v.Rule.Budget != nil {
			if r, ok := e.checkBudget(s, v, now, sc); ok {
				toCharge = append(toCharge, i)
			} else if !e.refuseOrShadow(d, v, i, r) {
				break
			}
		}
		if ru := v.Rule; ru.InFlight != nil {
			if ru.InFlight.Acquire(ru.Name, v.Key, ru.MaxInFlight) {
				sc.places = append(sc.places, place{t: ru.InFlight, rule: ru.Name, key: v.Key})
			} else if !e.refuseOrShadow(d, v, i, Verdict{Out: InFlight, Rule: ru, Key: v.Key, Retry: time.Second}) {
				break
			}
		}
	}
	// Wallets first: a wallet that cannot track its key refuses with 503,
	// which is not the client's doing, so no limit may count it. A limit
	// that racing requests filled since the decision refuses after the
	// charge: the cost stays charged (the race's only cost), the
	// reservations go.
	if d.Admitted && len(toCharge) > 0 {
		e.chargeAll(d, toCharge, sc)
	}
	for i := 0; d.Admitted && i < len(d.Verdicts); i++ {
		if v := &d.Verdicts[i]; !e.count(s, v, now, sc) {
			d.Worst, d.worst, d.Admitted = *v, i, false
			for _, w := range d.Wallets {
				w.Release()
			}
			d.Wallets = nil
		}
	}
	if !d.Admitted {
		for _, p := range sc.places {
			p.t.Add(p.rule, p.key, -1)
		}
		sc.places = sc.places[:0]
	}
}

// refuseOrShadow applies refusal r, found after evaluation (a wallet, an
// in-flight cap), to verdict i: a shadow rule counts it and goes on (it
// reports true); any other refuses the request.
func (e *Engine) refuseOrShadow(d *Decision, v *Verdict, i int, r Verdict) bool {
	if v.Shadow {
		v.Rule.Counts.Count(r.Out, true, v.hits)
		if v.Worse(&r) {
			v.Out = r.Out
		}
		return true
	}
	d.Worst, d.worst, d.Admitted = r, i, false
	return false
}

// refusal finishes a refused request: Retry-After over every limit, ban
// and wallet it matched (or Never), and a drip's hold.
func (e *Engine) refusal(s *Set, now time.Time, noDrip bool, sc *Scratch, d *Decision) {
	w := &d.Worst
	switch {
	case w.Out == InFlight:
		d.Retry = time.Second // a place frees when a request ends: no promise
	default:
		wait, never := e.retryAll(s, d.Verdicts, now, sc)
		d.Never = never
		if !never {
			d.Wait = max(w.Retry, wait)
			d.Retry = max(d.Wait, time.Second)
		}
	}
	w.Retry = d.Retry
	if w.Out == Drip && !noDrip {
		if e.hold(w.Rule.Name, w.Key, &s.tarpit) {
			d.Drip = true
			sc.places = append(sc.places, place{rule: w.Rule.Name, key: w.Key, tarpit: true})
		} else {
			w.Out = TarpitFull
		}
	}
	if d.worst >= 0 {
		d.Verdicts[d.worst].Out = w.Out // the final outcome, as counted
	}
}

// shadowWaits gives each shadow verdict that would have refused the wait
// its refusal would have had, had its rule been enforced (Retry, or Never
// where no wait is enough), so that its log line previews what a client
// would have been told: the request's Retry-After covers only the
// verdicts that refuse. A shadow rule counts every hit, but an enforced
// rule that does not count refused requests would not have counted this
// one: its wait is reckoned without them. Only shadow refusals pay for
// it, a few reads each.
func (e *Engine) shadowWaits(s *Set, now time.Time, sc *Scratch, d *Decision) {
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		if !v.Shadow || !v.Out.Refuses() || v.Rule == nil {
			continue
		}
		var counted []uint32 // v.ests as counted, restored after
		if v.counted && !v.Rule.CountRefused {
			counted = sc.take(len(v.ests))
			copy(counted, v.ests)
			for j := range v.ests {
				v.ests[j] = v.before(j)
			}
		}
		w := e.waitFor(s, v, now, sc)
		if counted != nil {
			copy(v.ests, counted)
		}
		if w == forever {
			v.Never, v.Retry = true, 0
		} else {
			v.Retry = max(v.Retry, w, time.Second)
		}
	}
}

// countOutcomes counts each rule's outcome: for an admitted request every
// verdict's (a quota it was over counts its refusal), and whether it left
// the key near its limit; for a refused one the refusal of every rule that
// refused it. Shadow refusals were counted as they were found; allowlisted
// decisions too.
func (e *Engine) countOutcomes(d *Decision) {
	if d.Gone {
		return
	}
	for i := range d.Verdicts {
		v := &d.Verdicts[i]
		switch {
		case v.Rule == nil || v.Out == Allowlisted || v.Shadow && v.Out.Refuses():
		case d.Admitted, v.Out.Refuses():
			v.Rule.Counts.Count(v.Out, false, v.hits)
			if v.Out == Allow && v.Limit != nil && nearLimit(v.Est, v.Theta) {
				v.Rule.Counts.near.Add(1)
			}
			if v.Out.Refuses() && v.Over && v.Limit != nil {
				v.Rule.Counts.refusedBy(v.Limit.Name) // the limit it was over
			}
		}
	}
}

// NearLimit reports whether an admitted verdict left its key near its
// limit (above NearLimitNum/NearLimitDen of it).
func (v *Verdict) NearLimit() bool {
	return v.Limit != nil && !v.Over && nearLimit(v.Est, v.Theta)
}

// nearLimit reports whether a count est, this request included, is above
// NearLimitRatio of its threshold theta: envoyproxy/ratelimit's
// near_limit, a client close to being refused.
func nearLimit(est, theta uint32) bool {
	return uint64(est)*NearLimitDen > uint64(theta)*NearLimitNum
}

// NearLimitNum / NearLimitDen is the share of a limit above which an
// admitted request is near its limit: 4/5, envoyproxy/ratelimit's
// NEAR_LIMIT_RATIO default of 0.8.
const (
	NearLimitNum = 4
	NearLimitDen = 5
)

// estimate is a sketch key's count in l's sketch: this replica's, or the
// fleet's where the key is heavy enough to share; the part of it this
// replica may not use (other replicas hold it, or it is their share); and
// what the engine owes the fleet once the request is decided (Answer).
// uncond: the request counts whatever the answer (Query.Unconditional);
// start is the request's (Query.Start).
func (e *Engine) estimate(k []byte, l *Limit, add uint32, uncond bool, now time.Time, start *time.Time) (est, others uint32, a Answer) {
	local := l.sk.EstimateBytes(k)
	a = e.shared(Query{Key: k, Local: l.sk, Tick: l.Tick, Theta: l.Threshold, Count: local, Add: add, Unconditional: uncond, Now: now, Start: start})
	return a.Est, a.Est - min(a.Est, local), a
}

// shared is the fleet's answer to q (Fleet.Estimate), or q's count without
// a fleet.
func (e *Engine) shared(q Query) Answer {
	if e.opts.Fleet == nil {
		return Answer{Est: q.Count}
	}
	return e.opts.Fleet.Estimate(q)
}

// unhold tells the fleet of each limit of v it holds room in (v.holds)
// that the request was not counted there: refused, by that limit or
// another.
func (e *Engine) unhold(v *Verdict, sc *Scratch) {
	for i, l := range v.Rule.Limits {
		if h := v.holds[i]; h != 0 {
			sc.buf = skey(sc.buf, v.Rule.Name, l.Name, v.Key)
			e.opts.Fleet.Settle(sc.buf, h, v.add, false)
			v.holds[i] = 0
		}
	}
	v.held = false
}

// told tells the fleet of each of v's limits that asked (v.tell) that the
// request counted in it.
func (e *Engine) told(v *Verdict, sc *Scratch) {
	for i, l := range v.Rule.Limits {
		if v.tell&(1<<i) != 0 {
			sc.buf = skey(sc.buf, v.Rule.Name, l.Name, v.Key)
			e.opts.Fleet.Counted(sc.buf)
		}
	}
	v.tell = 0
}

// count counts v's hits in its limits, as decided: a rule that counted
// them in evaluate already (refused: count) counts nothing more; a shadow
// rule or a quota adds them unconditionally (whether over or not, as
// envoyproxy/ratelimit counts every hit); any other adds them only if
// they still fit (one compare-and-swap: check and count in one step), and
// reports false if a limit no longer has room for them (racing requests
// took it). Where racing requests took a count past the fleet's ceiling
// (Answer.Ceiling), the fleet is asked again, at most twice.
func (e *Engine) count(s *Set, v *Verdict, now time.Time, sc *Scratch) bool {
	ru := v.Rule
	if ru == nil || v.Out == Allowlisted || len(v.ests) == 0 || v.banned || v.counted || v.noCount {
		if v.counted && v.tell != 0 {
			e.told(v, sc) // counted when evaluated: admitted now
		}
		return true
	}
	strict := !v.Shadow && !v.Quota
	for i, l := range ru.Limits {
		sc.buf = skey(sc.buf, ru.Name, l.Name, v.Key)
		var est uint32
		var first, ok bool
		for try := 0; ; try++ {
			top := uint32(math.MaxUint32) // unconditional
			ceiling := false
			if strict {
				top = v.thetas[i] - min(v.thetas[i], v.others[i])
				if c := v.ceils[i]; c > 0 && c < top {
					top, ceiling = c, true
				}
			}
			// The library's conditional add: check and count in one
			// compare-and-swap, at the request's tick (now), the tick the
			// fleet decided it at. The sketch's own tick (time.Time{})
			// follows the wall clock by its ticker's wake-up, late at a
			// tick's end on a busy machine: a request a fleet decided
			// just past the end was counted in the tick before, halved
			// once more than the fleet's records of it, and the next
			// request of its key on that replica was let in a tick early
			// (4 of 3 in TestFleetProcessSmallLimitAtOnce under -race).
			est, first, ok = l.sk.ObserveBytesNWithin(now, sc.buf, v.add, top)
			if ok || !ceiling || try == 2 || !e.askAgain(v, i, l, est, s.wallets, now, sc) {
				break
			}
		}
		if h := v.holds[i]; ok && h != 0 {
			e.opts.Fleet.Settle(sc.buf, h, v.add, true)
			v.holds[i] = 0
		}
		if !ok {
			// The count that refused it, for Retry-After and the fields.
			v.ests[i] = est + v.others[i]
			v.Out, v.Over, v.Limit, v.Est, v.Theta = Reject, true, l, v.ests[i], v.thetas[i]
			v.Level = float64(uint64(v.Est)+uint64(v.add)) / float64(nominal(v.Theta))
			return false
		}
		v.ests[i] = est + v.others[i]
		v.first = v.first || i == 0 && first
		if v.tell&(1<<i) != 0 {
			e.opts.Fleet.Counted(sc.buf)
		}
	}
	v.tell = 0
	v.held = false
	v.counted = true
	return true
}

// askAgain asks the fleet of limit i of v (sc.buf its sketch key) again,
// its local count now local, after racing requests took it past the
// fleet's ceiling: it reports whether the request still fits. locked:
// the request holds wallets' locks (admit), so the fleet may not wait.
func (e *Engine) askAgain(v *Verdict, i int, l *Limit, local uint32, locked bool, now time.Time, sc *Scratch) bool {
	a := e.shared(Query{Key: sc.buf, Local: l.sk, Tick: l.Tick, Theta: l.Threshold, Count: local, Add: v.add, NoWait: locked, Now: now, Start: &sc.start})
	v.others[i] = a.Est - min(a.Est, local)
	v.ceils[i] = a.Ceiling
	v.owe(i, a)
	return uint64(a.Est)+uint64(v.add) <= uint64(v.thetas[i])
}

// owe notes what the engine owes the fleet for limit i of v once the
// request is decided (Answer.Tell, Answer.Hold).
func (v *Verdict) owe(i int, a Answer) {
	if a.Tell && i < 64 {
		v.tell |= 1 << i
	}
	v.holds[i] = a.Hold
	v.held = v.held || a.Hold != 0
}

// afterCount does what follows a counted verdict: once per tick a key is
// active, it teaches the memory of keys (so that the lottery keeps steady
// clients over one-off keys), and a key that climbed past ban_above is
// banned. A banned key's attempts are not counted: the ban is its
// punishment.
func (e *Engine) afterCount(s *Set, v *Verdict, sc *Scratch) {
	if !v.counted || v.Rule == nil {
		return
	}
	if v.first && !s.nk.Disabled {
		sc.buf = skey(sc.buf, v.Rule.Name, tagKnown, v.Key)
		s.known.ObserveBytes(sc.buf)
	}
	if v.setBan {
		sc.buf = skey(sc.buf, v.Rule.Name, tagBan, v.Key)
		s.bans.ObserveBytesN(time.Time{}, sc.buf, 16) // 16 >> 4 ticks of ban_for/4: about ban_for
		e.lastBan.Store(e.Now().UnixNano())
	}
}

// evaluate decides fact f at now into v. It counts nothing, unless its
// rule counts refused requests: then it counts this one now, whatever the
// verdicts, in one pass.
func (e *Engine) evaluate(s *Set, f *Fact, now time.Time, sc *Scratch, v *Verdict) {
	ru := f.Rule
	*v = Verdict{Rule: ru, Key: f.Key, Shadow: ru.Shadow, Quota: f.Quota, noCount: f.ZeroHits || f.Negative, hits: f.hits()}
	if !f.ZeroHits {
		v.add = rate.Counts(uint64(max(f.Hits, 1)))
	}
	if ru.Block {
		if v.Over = v.add > 0 && !f.Negative; v.Over {
			v.Out, v.Never, v.Level = Reject, true, math.Inf(1)
		}
		return
	}
	// A ban lasts at most 5 ticks of ban_for/4: without one that recent, no
	// key is banned, and the lookup is skipped.
	if last := e.lastBan.Load(); len(ru.Limits) > 0 && last != 0 && now.UnixNano()-last <= 8*int64(s.banTick) {
		sc.buf = skey(sc.buf, ru.Name, tagBan, f.Key)
		v.banned = s.bans.EstimateBytes(sc.buf) > 0
	}
	active := e.readCounts(v, now, sc)
	if len(ru.Limits) > 0 || ru.Budget != nil {
		v.newKey = e.isNewKey(s, ru, f.Key, now, active, sc)
	}
	for i, l := range ru.Limits {
		theta := l.Threshold
		if v.newKey {
			theta = max(rate.Unit, uint32(float64(theta)*s.nk.BudgetFactor))
		}
		v.thetas[i] = theta
		after := uint64(v.before(i)) + uint64(v.add)
		lv := float64(after) / float64(nominal(theta))
		if v.Limit == nil || lv > v.Level {
			v.Level, v.Limit, v.Est, v.Theta = lv, l, uint32(min(after, math.MaxUint32)), theta
		}
		v.Over = v.Over || after > uint64(theta)
		v.Never = v.Never || v.add > theta
	}
	if f.Negative {
		v.Over, v.Never, v.Level = false, false, 0
	}
	if len(ru.Limits) > 0 {
		if b := uint64(v.before(0)) + rate.Unit; 2*b > uint64(v.thetas[0]) {
			ru.top.Offer(f.Key, uint32(min(b, math.MaxUint32))) // the first limit's: the TopK's clock
		}
	}
	v.Out, v.Delay, v.setBan = s.tarpit.ladder(v)
}

// readCounts reads v's count in each of its rule's limits into v.ests
// (counting this request first where the rule counts refused requests),
// and reports whether the key is active in any.
func (e *Engine) readCounts(v *Verdict, now time.Time, sc *Scratch) (active bool) {
	ru := v.Rule
	if len(ru.Limits) == 0 {
		return false
	}
	n := len(ru.Limits)
	v.ests, v.thetas, v.others, v.ceils, v.holds = sc.take(n), sc.take(n), sc.take(n), sc.take(n), sc.take(n)
	v.counted = ru.CountRefused && !v.banned && !v.noCount
	for i, l := range ru.Limits {
		sc.buf = skey(sc.buf, ru.Name, l.Name, v.Key)
		var a Answer
		if v.counted {
			after, first := l.sk.ObserveBytesN(now, sc.buf, v.add) // at the request's tick, as count adds
			// The fleet is asked with the count before this request's
			// hits, as when they count once admitted, so that it claims
			// them once (Fleet.Estimate); its answer is then after them.
			a = e.shared(Query{Key: sc.buf, Local: l.sk, Tick: l.Tick, Theta: l.Threshold,
				Count: after - min(after, v.add), Add: v.add, Counted: true, Unconditional: v.Shadow || v.Quota, Now: now, Start: &sc.start})
			shared := uint32(min(uint64(a.Est)+uint64(v.add), math.MaxUint32))
			v.ests[i], v.others[i] = shared, shared-min(shared, after)
			v.first = v.first || i == 0 && first
		} else {
			// A fact that counts nothing (negative hits) asks as a read.
			add := v.add
			if v.noCount {
				add = 0
			}
			v.ests[i], v.others[i], a = e.estimate(sc.buf, l, add, v.Shadow || v.Quota, now, &sc.start)
		}
		v.ceils[i] = a.Ceiling
		v.owe(i, a)
		active = active || v.before(i) > 0
	}
	return active
}

// ladder is the tarpit's outcome for a verdict at its level: its outcome,
// a delay's length, and whether it bans the key.
func (t *TarpitSpec) ladder(v *Verdict) (Outcome, time.Duration, bool) {
	switch {
	case v.banned:
		return Ban, 0, false
	case v.Limit == nil || !v.Over:
		return Allow, 0, false
	case !v.Rule.Tarpit:
		return Reject, 0, false
	case v.Level > t.BanAbove:
		return Ban, 0, true
	case v.Level > t.RejectAbove:
		return Reject, 0, false
	case v.Level > t.DripAbove:
		return Drip, 0, false
	case v.Level > t.DelayAbove && t.MaxDelay == 0:
		return Reject, 0, false // max_delay 0s: nothing is held
	case v.Level > t.DelayAbove:
		span := max(t.DripAbove-t.DelayAbove, 1e-9)
		d := time.Duration(float64(t.MaxDelay) * min(1, (v.Level-t.DelayAbove)/span))
		return Delay, max(d, 50*time.Millisecond), false
	}
	return Allow, 0, false // exactly at the ladder's first step
}

// nominal is a threshold as the limit's words set it, Unit counts per
// request of its burst: a smooth limit's threshold holds one count more
// (rate.Limit.Threshold), which a level leaves out, so that a key at its
// burst is at level 1 whatever the decay.
func nominal(theta uint32) uint32 { return max(theta&^1, 1) }
