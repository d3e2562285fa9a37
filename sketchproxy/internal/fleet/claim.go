package fleet

import (
	"math"
	"slices"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// A key just shared (young: its first two intervals, shareView.young, or
// promoted here and not yet answered) is where every replica reaches for
// the pool at once: a quiet share reckoned from a view of another moment
// is taken again by the others, and a loud claim on the last room reaches
// them a publish later, after they took it too (22 to 24 of a burst of 20
// over 3 replicas, before claims).
//
// So while a key is young, a request that would take this replica's
// count past what Redis holds for it (confirmed: what a reply showed its
// record holds) claims: it sends the count, itself included, and decides
// from that send's reply. Redis runs each replica's script whole, one
// after another, so each reply holds every claim made before it: two
// replicas never take the same room. A replica's claims on one key go one
// at a time, each for the requests waiting behind it too (within this
// replica's share of the room its view shows), and the claims of all its
// keys that wait at once go in
// one send. A request it admits holds its room (handed) until the engine
// settles it (Settle: counted, or refused after all), so two requests in
// flight never take one claim, and a count claimed that no request took
// (a request refused by another limit after its claim, a waiter that gave
// up) is taken by the next request without a send. A claim Redis refused
// (another replica's came first) stays in the record until it halves:
// the others may have read it, and a record never reads lower
// (keepPeers). A key promoted here reads its records before it claims, so
// that no claim is made blind.
//
// A request waits at most the fleet's timeout from its first wait
// (engine.Query.Start), over all of its keys, for the key's claims
// before it and the sends ahead of it (a request that sends a batch
// waits for it, to the latest deadline in the batch); past it, it is
// decided as while Redis is down (late), its count published at once.
// Wallets (the engine checks them against what requests in flight
// reserve), rules that count whatever the answer (shadow, quota) and
// queries that may not wait (engine.Query.NoWait) do not claim; nor do
// keys whose fair share θ/N holds no whole request: every key of such a
// limit is shared from its first request, and a claim Redis refused
// there would hold the whole limit in its record until it halves (1 a
// second over 3 replicas at 10x: 0.93 of one replica alone with claims).

// claim decides q for e, young or not yet answered, with n replicas. ok is
// false where, once the request's turn came, the key was no longer young
// or Redis was down: Estimate then decides it as any other.
func (f *Fleet) claim(e *hotEntry, q *engine.Query, n int64) (_ engine.Answer, ok bool) {
	deadline := f.deadline(q)
	tk := q.Now.UnixNano() / int64(e.tick)
	if time.Until(deadline) < time.Millisecond {
		return f.late(e, q, n, tk), true // the request waited its time on other keys
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	e.waiting.Add(1)
	select {
	case e.claiming <- struct{}{}:
		e.waiting.Add(-1)
	case <-t.C:
		e.waiting.Add(-1)
		return f.late(e, q, n, tk), true
	}
	defer func() { <-e.claiming }()
	v := e.view.Load()
	if v != nil && !v.young || !f.up.Load() {
		return engine.Answer{}, false
	}
	if v == nil || !e.answered.Load() {
		// Promoted here, not yet answered: the key's records first (a
		// send of what this replica counted, no claim), so that a claim
		// is made from a view of now: one made blind, or from a claim
		// heard before the promotion (the key may have aged since), on
		// a key others filled would hold its count in the record,
		// refused, until it halves (keepPeers never lets a record read
		// lower).
		if v, ok = f.sendClaim(e, deadline); !ok || v == nil || e.unsynced.Load() {
			return f.late(e, q, n, tk), true
		}
		if !v.young {
			return engine.Answer{}, false // a key long shared elsewhere
		}
	}
	need := e.need(q, tk)
	top, _ := v.allowance(q.Theta, tk)
	switch {
	case need > uint64(top):
		// Refused by what this replica knows: no word needed.
		return engine.Answer{Est: refusedAt(need, q, top)}, true
	case need <= uint64(e.confirmedAt(tk)):
		// Redis holds this count already: a claim no request took.
		return f.admit(e, v, q, top, n), true
	case time.Until(deadline) < time.Millisecond:
		return f.late(e, q, n, tk), true
	}
	// The requests waiting behind this one are claimed for too, within
	// this replica's share of the room this view shows (what a race
	// with the others' claims may leave unused in the record): each then
	// finds its count held.
	extra := min(uint64(e.waiting.Load())*uint64(q.Add), (uint64(top)-need)/uint64(max(1, n)))
	c := need + extra
	e.grant(uint32(min(c, math.MaxUint32)), tk)
	e.loud.Store(true)
	v, sent := f.sendClaim(e, deadline)
	if !sent || v == nil || e.unsynced.Load() {
		// Redis slow (or not answering with the key's records). The
		// count stays granted: the send may have written it.
		return f.late(e, q, n, tk), true
	}
	if !v.young {
		// A key long shared elsewhere: its view is installed (apply).
		return engine.Answer{}, false
	}
	top, _ = v.allowance(q.Theta, tk)
	if need > uint64(top) {
		// Another replica's claim came first. The record holds this
		// one until it halves, and the next request here takes it
		// without a send.
		return engine.Answer{Est: refusedAt(need, q, top)}, true
	}
	return f.admit(e, v, q, top, n), true
}

// deadline is when q's waits on the network end: the fleet's timeout
// from the request's first wait.
func (f *Fleet) deadline(q *engine.Query) time.Time {
	if q.Start == nil {
		return time.Now().Add(time.Duration(f.cfg.Timeout))
	}
	if q.Start.IsZero() {
		*q.Start = time.Now()
	}
	return q.Start.Add(time.Duration(f.cfg.Timeout))
}

// late is the answer to q, of e at tick tk, where Redis did not answer in
// time: as while it is down (Estimate), θ/N and no more than the room the
// others left at the last word from Redis, its count published at once.
// Redis slow for every replica, each holds to θ/N, and the fleet to θ; a
// replica cut off while Redis answers the others may count its θ/N of a
// young key unseen, as during any outage of its own.
func (f *Fleet) late(e *hotEntry, q *engine.Query, n int64, tk int64) engine.Answer {
	f.lates.Add(1)
	est := alone(q.Count, q.Theta, n)
	if v := e.view.Load(); v != nil {
		est = max(est, v.withOthers(q.Count, tk))
	}
	return engine.Answer{Est: est, Tell: true}
}

// need is what e's count here reaches with q: the counts the requests in
// flight hold room for (handed), the count now (read after them: requests
// admitted before this one's turn may have counted, and one counted and
// settled in between is then counted twice for a moment, never missed),
// and q's hits unless they are counted already.
func (e *hotEntry) need(q *engine.Query, tk int64) uint64 {
	e.cmu.Lock()
	e.rebase(tk)
	handed := uint64(e.handed)
	e.cmu.Unlock()
	cur := uint64(max(q.Count, e.sk.EstimateBytes(e.skey)))
	if q.Counted {
		return max(uint64(q.Count)+uint64(q.Add), cur) + handed
	}
	return cur + handed + uint64(q.Add)
}

// admit answers q admitted from view v (top, the most this replica's
// count may reach): its room is held until the engine settles it, where
// it is not counted already. The estimate is the view's: the engine's
// conditional add holds the count to top (requests admitted before it
// hold room below it), and a suspect view to θ/N.
func (f *Fleet) admit(e *hotEntry, v *shareView, q *engine.Query, top uint32, n int64) engine.Answer {
	a := engine.Answer{Est: estimateAt(q.Count, q.Theta, top)}
	if v.suspect {
		a.Est = max(a.Est, alone(q.Count, q.Theta, n))
	}
	if !q.Counted {
		e.cmu.Lock()
		e.handed = uint32(min(uint64(e.handed)+uint64(q.Add), math.MaxUint32))
		e.cmu.Unlock()
		a.Hold = e.id
	}
	return a
}

// refusedAt is the estimate of q refused because need, this replica's
// count with it, passes top: past θ by as much.
func refusedAt(need uint64, q *engine.Query, top uint32) uint32 {
	return uint32(min(need-min(need, uint64(q.Add))+uint64(q.Theta)-uint64(min(q.Theta, top)), math.MaxUint32))
}

// confirmedAt is the count a reply showed Redis holds for this replica,
// halved to tick tk.
func (e *hotEntry) confirmedAt(tk int64) uint32 {
	e.cmu.Lock()
	defer e.cmu.Unlock()
	e.rebase(tk)
	return e.confirmed
}

// grant raises the count claimed (what the next send writes, at least)
// to c, at tick tk.
func (e *hotEntry) grant(c uint32, tk int64) {
	e.cmu.Lock()
	e.rebase(tk)
	e.granted = max(e.granted, c)
	e.cmu.Unlock()
}

// confirm records that a send Redis answered wrote c at tick tk.
func (e *hotEntry) confirm(c uint32, tk int64) {
	e.cmu.Lock()
	e.rebase(tk)
	if tk >= e.claimTk {
		e.confirmed = max(e.confirmed, c)
	}
	e.cmu.Unlock()
}

// rebase brings the claimed and confirmed counts to tick tk, halved as
// the local count is (e.cmu held); the counts requests in flight hold
// room for are added whole, and do not halve. A later tick than tk (a
// send dated a moment later) stays.
func (e *hotEntry) rebase(tk int64) {
	if tk > e.claimTk {
		e.granted = halve(e.granted, tk-e.claimTk)
		e.confirmed = halve(e.confirmed, tk-e.claimTk)
		e.claimTk = tk
	}
}

// Settle is told what became of a request whose room a claim held
// (engine.Answer.Hold): counted in the local count, or not (its room is
// free for the next request). A hold of an entry since dropped (a reload,
// a demotion) is no longer anyone's.
func (f *Fleet) Settle(skey []byte, hold uint32, add uint32, counted bool) {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e == nil || e.id != hold {
		return
	}
	e.cmu.Lock()
	e.handed -= min(e.handed, add)
	e.cmu.Unlock()
}

// claimBatch is the entries whose claims (or first reads) wait for a send
// together: the first of their requests to hold f.sending sends them all
// in one pipeline, until the latest of their deadlines.
type claimBatch struct {
	es       []*hotEntry
	deadline time.Time
	views    []*shareView // each entry's view from the reply
	ok       bool
	done     chan struct{}
}

// sendClaim sends e with the other claims waiting, and returns the view
// the reply built for it; it waits for the sends ahead of it until
// deadline (and for the batch it sends, until the batch's).
func (f *Fleet) sendClaim(e *hotEntry, deadline time.Time) (*shareView, bool) {
	f.cqMu.Lock()
	b := f.cq
	if b == nil {
		b = &claimBatch{done: make(chan struct{})}
		f.cq = b
	}
	i := slices.Index(b.es, e)
	if i < 0 {
		i = len(b.es)
		b.es = append(b.es, e)
	}
	if deadline.After(b.deadline) {
		b.deadline = deadline
	}
	f.cqMu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case f.sending <- struct{}{}:
		f.cqMu.Lock()
		if f.cq == b {
			f.cq = nil // this batch is sent now: later claims start another
		}
		f.cqMu.Unlock()
		select {
		case <-b.done: // sent by the holder before this one
		default:
			f.sendBatch(b)
		}
		<-f.sending
	case <-b.done:
	case <-t.C:
		// The batch may still go (another's deadline): this request's
		// count is granted, and a send writes it.
		return nil, false
	}
	if !b.ok {
		return nil, false
	}
	return b.views[i], true
}

// sendBatch sends b's entries (f.sending held) until b's deadline, and
// closes b.done once b.views and b.ok hold the outcome. Entries whose
// claims it could not send publish them at their next send.
func (f *Fleet) sendBatch(b *claimBatch) {
	defer close(b.done)
	f.cqMu.Lock()
	deadline := b.deadline // no waiter joins once the batch left f.cq
	f.cqMu.Unlock()
	b.views = make([]*shareView, len(b.es))
	if time.Until(deadline) <= 0 {
		return
	}
	for _, e := range b.es {
		e.pending.Store(false) // sent now
	}
	f.batches.Add(1)
	f.batched.Add(uint64(len(b.es)))
	loud := make([]bool, len(b.es))
	for i, e := range b.es {
		loud[i] = e.loud.Load()
	}
	if !f.sendHeld(b.es, false, time.Until(deadline), true) {
		for i, e := range b.es {
			if loud[i] {
				e.loud.Store(true)
			}
		}
		return
	}
	b.ok = true
	for i, e := range b.es {
		b.views[i] = e.own
	}
}
