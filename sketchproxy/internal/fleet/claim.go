package fleet

import (
	"math"
	"slices"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// A key just shared (young: its first two intervals, shareView.young, or
// promoted here and not yet answered) is where every replica reaches for
// the pool at once: room reckoned from a view of another moment is taken
// again by the others, and a loud claim on the last room reaches
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
// up) is taken by the next request without a send. A claim is
// conditional (shareScript): written only where it fits beside what the
// others' records hold, so one that does not is never in the record (one
// that stayed there, refused, held its room until it halved: a record
// never reads lower, keepPeers). A key promoted here claims at once,
// within θ less each other replica's promotion point (claimLimit), and a
// claim not written where the reply shows room is sent again from the
// reply's view (claimTries); one not written beside a record that does
// not verify is decided as while Redis is down (unsure).
//
// A request waits at most the fleet's timeout from its first wait
// (engine.Query.Start), over all of its keys, for the key's claims
// before it and the sends ahead of it (a request that sends a batch
// waits for it, to the latest deadline in the batch); past it, it is
// decided as while Redis is down (late), its count published at once.
// Wallets (the engine checks them against what requests in flight
// reserve), rules that count whatever the answer (shadow, quota) and
// queries that may not wait (engine.Query.NoWait) do not claim. Keys
// whose fair share θ/N holds no whole request are shared from their
// first request, which claims: each replica admitted one alone before
// (3 of a burst of 1 over 3 replicas). Past their first two intervals
// they hold no guarantee, and every request past what Redis holds
// claims (pastQuiet).

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
	force := false // the next claim unconditional (a forged record)
	for try := 0; ; try++ {
		v := e.view.Load()
		if !f.up.Load() {
			return engine.Answer{}, false
		}
		need := e.need(q, tk)
		var extra uint64
		if v != nil && e.answered.Load() {
			top, quiet := v.allowance(q.Theta, tk)
			// Refused by what this replica knows, or held by Redis
			// already (a claim no request took): no word needed.
			if a, ok := f.decided(e, v, q, need, top, n, tk); ok {
				return a, true
			}
			if !v.young && need <= uint64(quiet) {
				// A key past its first two intervals, within its
				// guarantee or what Redis holds for it: no word needed
				// (Estimate).
				return engine.Answer{}, false
			}
			// The requests waiting behind this one are claimed for too,
			// within this replica's share of the room this view shows
			// (what a race with the others' claims may leave unused):
			// each then finds its count held.
			extra = min(uint64(e.waiting.Load())*uint64(q.Add), (uint64(top)-need)/uint64(max(1, n)))
		}
		// Promoted here and not yet answered, the claim goes blind: the
		// script writes it only if the key's records leave room for it
		// (shareScript), so a key others filled does not hold it.
		if time.Until(deadline) < time.Millisecond {
			return f.late(e, q, n, tk), true
		}
		if c := uint32(min(need+extra, math.MaxUint32)); force {
			e.grant(c, tk)
		} else {
			e.claimFor(c, tk)
		}
		e.loud.Store(true)
		v, sent := f.sendClaim(e, deadline)
		if !sent || v == nil || e.unsynced.Load() {
			// Redis slow (or not answering with the key's records). The
			// count is granted: the send may have written it.
			return f.late(e, q, n, tk), true
		}
		// Refused where another replica's claim came first; admitted
		// where the record holds the claim.
		top, _ := v.allowance(q.Theta, tk)
		if a, ok := f.decided(e, v, q, need, top, n, tk); ok {
			return a, true
		}
		switch {
		case v.forged && !force && time.Until(deadline) >= time.Millisecond:
			// A record this replica does not believe (made up by a
			// writer without the secret, or of a replica before signed
			// records) filled the key for the script. The claim goes
			// again unconditionally, as claims went before they were
			// conditional: written whatever the script reckons, and
			// decided from the records that verify (it stays in the
			// record, whatever the answer, until it halves). Deciding it
			// at θ/N let each replica admit a request of a limit whose
			// θ/N holds none (3 of a burst of 1).
			force = true
			continue
		case v.forged:
			return f.unsure(e, q, n, tk), true
		case try < claimTries-1:
			// The script found no room that this view shows: the others
			// claimed between the view it was sized from and the send (or
			// it went blind). Again from the view of the reply.
			continue
		}
		// The others' claims took the room at every try.
		return engine.Answer{Est: max(q.Theta, refusedAt(need, q, top))}, true
	}
}

// decided is q's answer where view v settles it without a claim: refused
// where need, this replica's count with q, passes top, what the view
// lets it reach; admitted where Redis holds need already. ok is false
// where a claim must be sent.
func (f *Fleet) decided(e *hotEntry, v *shareView, q *engine.Query, need uint64, top uint32, n, tk int64) (_ engine.Answer, ok bool) {
	switch {
	case need > uint64(top):
		return engine.Answer{Est: refusedAt(need, q, top)}, true
	case need <= uint64(e.confirmedAt(tk)):
		return f.admit(e, v, q, top, n), true
	}
	return engine.Answer{}, false
}

// claimTries is how many claims a request sends at most: each refused
// by the script where the view of its reply showed room (the others
// claimed in between) tries again from that view, within the request's
// wait.
const claimTries = 3

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

// unsure is the answer to q, of e at tick tk, where Redis answered but
// the records this replica believes do not say why its claim was not
// written: as late, but not counted as late.
func (f *Fleet) unsure(e *hotEntry, q *engine.Query, n int64, tk int64) engine.Answer {
	est := alone(q.Count, q.Theta, n)
	if v := e.view.Load(); v != nil {
		est = max(est, v.withOthers(q.Count, tk))
	}
	return engine.Answer{Est: est, Tell: true}
}

// late is the answer to q, of e at tick tk, where Redis did not answer in
// time: as while it is down (Estimate), θ/N and no more than the room the
// others left at the last word from Redis, its count published at once.
// Redis slow for every replica, each holds to θ/N, and the fleet to θ; a
// replica cut off while Redis answers the others may count its θ/N of a
// young key unseen, as during any outage of its own.
func (f *Fleet) late(e *hotEntry, q *engine.Query, n int64, tk int64) engine.Answer {
	f.lates.Add(1)
	return f.unsure(e, q, n, tk)
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

// claimFor makes c, at tick tk, the count the next send claims: written
// only if it fits (shareScript), and granted (written by every send
// after) once a reply shows it written, or where a send failed and may
// have written it.
func (e *hotEntry) claimFor(c uint32, tk int64) {
	e.cmu.Lock()
	e.rebase(tk)
	e.claim = max(e.claim, c)
	e.cmu.Unlock()
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
		e.claim = halve(e.claim, tk-e.claimTk)
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
