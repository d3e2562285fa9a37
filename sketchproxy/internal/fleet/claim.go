package fleet

import (
	"math"
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
// count past what Redis holds for it (granted: its record's count, as its
// claims wrote it) claims: it sends the count, itself included, and
// decides from that send's reply. Redis runs each replica's script whole,
// one after another, so each reply holds every claim made before it: two
// replicas never take the same room. One replica's claims on a key go
// one at a time; a request it admits holds its room (handed) until the
// engine settles it (Settle: counted, or refused after all), so two
// requests in flight never take one claim, and a claim that no request
// took (a request refused by another limit after its claim) is taken by
// the next request without a send. A claim Redis refused (another
// replica's came first) stays in the record until it halves: the others
// may have read it, and a record never reads lower (keepPeers). A key
// promoted here reads its records before it claims, so that no claim
// is made blind.
//
// A request waits at most the fleet's timeout from the start of its
// decision (engine.Query.Start), over all of its keys, for the key's
// claims before it and the sends ahead of it (a round, other keys'
// claims); past it, it is decided as while Redis is down: at θ/N, and
// within the room the others left at the last word from Redis.
// Wallets do not claim (engine.Query.Wallet): the engine checks them
// against what requests in flight reserve, not with a conditional add.

// claim decides q for e, young or not yet answered, with n replicas. ok is
// false where, once the request's turn came, the key was no longer young
// or Redis was down: Estimate then decides it as any other.
func (f *Fleet) claim(e *hotEntry, q *engine.Query, n int64) (_ engine.Answer, ok bool) {
	start := q.Start
	if start.IsZero() {
		start = time.Now()
	}
	deadline := start.Add(time.Duration(f.cfg.Timeout))
	if time.Until(deadline) < time.Millisecond {
		return f.slow(e, q, n), true // the request waited its time on other keys
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case e.claiming <- struct{}{}:
	case <-t.C:
		return f.slow(e, q, n), true
	}
	defer func() { <-e.claiming }()
	v := e.view.Load()
	if v != nil && !v.young || !f.up.Load() {
		return engine.Answer{}, false
	}
	tk := q.Now.UnixNano() / int64(e.tick)
	if v == nil || !e.answered.Load() {
		// Promoted here, not yet answered: the key's records first (a
		// send of what this replica counted, no claim), so that a claim
		// is made from a view of now: one made blind, or from a claim
		// heard before the promotion (the key may have aged since), on
		// a key others filled would hold its count in the record,
		// refused, until it halves (keepPeers never lets a record read
		// lower).
		if v, ok = f.sendClaim(e, deadline); !ok || v == nil || e.unsynced.Load() {
			return f.slow(e, q, n), true
		}
		if !v.young {
			return engine.Answer{}, false // a key long shared elsewhere
		}
	}
	need := e.need(q, tk)
	if v != nil {
		top, _ := v.allowance(q.Theta, tk)
		switch {
		case need > uint64(top):
			// Refused by what this replica knows: no word needed.
			return engine.Answer{Est: refusedAt(need, q, top)}, true
		case need <= uint64(e.grantedAt(tk)):
			// Redis holds this count already: a claim no request took.
			return f.admit(e, v, q, top, n), true
		}
	}
	if time.Until(deadline) < time.Millisecond {
		return f.slow(e, q, n), true
	}
	e.grant(uint32(min(need, math.MaxUint32)), tk)
	e.loud.Store(true)
	v, sent := f.sendClaim(e, deadline)
	if !sent || v == nil || e.unsynced.Load() {
		// Redis slow (or not answering with the key's records): as
		// while it is down. The count stays granted: the send may have
		// written it.
		return f.slow(e, q, n), true
	}
	if !v.young {
		// A key long shared elsewhere: its view is installed (apply).
		return engine.Answer{}, false
	}
	top, _ := v.allowance(q.Theta, tk)
	if need > uint64(top) {
		// Another replica's claim came first. The record holds this
		// one until it halves (a record never reads lower: keepPeers),
		// and the next request here takes it without a send.
		return engine.Answer{Est: refusedAt(need, q, top)}, true
	}
	return f.admit(e, v, q, top, n), true
}

// slow is the answer to q where Redis did not answer in time: as while
// it is down (Estimate), its fair share θ/N, and no more than the room
// the others left at the last word from Redis.
func (f *Fleet) slow(e *hotEntry, q *engine.Query, n int64) engine.Answer {
	est := uint64(alone(q.Count, q.Theta, n))
	if v := e.view.Load(); v != nil {
		age := q.Now.UnixNano()/int64(e.tick) - v.tick
		sum := uint64(q.Count)
		for _, p := range v.others {
			sum += uint64(halve(p.c, age))
		}
		est = max(est, sum)
	}
	return engine.Answer{Est: uint32(min(est, math.MaxUint32))}
}

// need is what e's count here reaches with q: the count now (read again:
// requests admitted before this one's turn may have counted), the
// requests in flight that hold room, and q's hits unless they are counted
// already.
func (e *hotEntry) need(q *engine.Query, tk int64) uint64 {
	cur := uint64(max(q.Count, e.sk.EstimateBytes(e.skey)))
	if q.Counted {
		cur = max(uint64(q.Count)+uint64(q.Add), cur)
	} else {
		cur += uint64(q.Add)
	}
	e.cmu.Lock()
	defer e.cmu.Unlock()
	e.rebase(tk)
	return cur + uint64(e.handed)
}

// admit answers q admitted from view v (top, the most this replica's
// count may reach): its room is held until the engine settles it, where
// it is not counted already. The estimate is the view's: the engine's
// conditional add holds the count to top (requests admitted before it
// hold room below it), and a suspect view to θ/N.
func (f *Fleet) admit(e *hotEntry, v *shareView, q *engine.Query, top uint32, n int64) engine.Answer {
	a := engine.Answer{Est: uint32(min(uint64(q.Count)+uint64(q.Theta-min(q.Theta, top)), math.MaxUint32))}
	if v.suspect {
		a.Est = max(a.Est, alone(q.Count, q.Theta, n))
	}
	if !q.Counted {
		e.cmu.Lock()
		e.handed = uint32(min(uint64(e.handed)+uint64(q.Add), math.MaxUint32))
		e.cmu.Unlock()
		a.Held = true
	}
	return a
}

// refusedAt is the estimate of q refused because need, this replica's
// count with it, passes top: past θ by as much.
func refusedAt(need uint64, q *engine.Query, top uint32) uint32 {
	return uint32(min(need-min(need, uint64(q.Add))+uint64(q.Theta)-uint64(min(q.Theta, top)), math.MaxUint32))
}

// grantedAt is the count Redis holds for this replica by its claims,
// halved to tick tk.
func (e *hotEntry) grantedAt(tk int64) uint32 {
	e.cmu.Lock()
	defer e.cmu.Unlock()
	e.rebase(tk)
	return e.granted
}

// grant raises the count claimed to c, at tick tk.
func (e *hotEntry) grant(c uint32, tk int64) {
	e.cmu.Lock()
	e.rebase(tk)
	e.granted = max(e.granted, c)
	e.cmu.Unlock()
}

// rebase brings the claimed count to tick tk, halved (e.cmu held). A
// later tick than tk (a send dated a moment later) stays.
func (e *hotEntry) rebase(tk int64) {
	if tk > e.grantedTk {
		e.granted = halve(e.granted, tk-e.grantedTk)
		e.grantedTk = tk
	}
}

// Settle is told what became of a request whose room a claim held
// (engine.Answer.Held): counted in the local count, or not (its room is
// free for the next request).
func (f *Fleet) Settle(skey []byte, add uint32, counted bool) {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e == nil {
		return
	}
	e.cmu.Lock()
	e.handed -= min(e.handed, add)
	e.cmu.Unlock()
}

// sendClaim sends e alone, its claim published, and returns the view its
// reply built; it waits for the sends ahead of it until deadline.
func (f *Fleet) sendClaim(e *hotEntry, deadline time.Time) (*shareView, bool) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case f.sending <- struct{}{}:
	case <-t.C:
		return nil, false
	}
	defer func() { <-f.sending }()
	e.pending.Store(false) // sent now
	if !f.sendHeld([]*hotEntry{e}, false, time.Until(deadline), true) {
		return nil, false
	}
	return e.own, true
}
