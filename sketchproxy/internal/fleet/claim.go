package fleet

import (
	"math"
	"time"
)

// A key just shared (young: its first two intervals, shareView.young) is
// where every replica reaches for the pool at once: each replica's quiet
// share of it is reckoned from a view of another moment, so one spent is
// taken again by the others, and a loud claim on the last room reaches
// them only a publish later, after they took it too (22 to 24 of a burst
// of 20 over 3 replicas, TestFleetProcessBurst). Holding each other
// replica at its quiet share instead refused requests within the limit
// (a share held for a replica that did not spend it is room no one uses
// until the next round: TestFleetSimBurstAtBirth).
//
// So while a key is young (answered at least once: a request before any
// word from Redis is decided at θ/N, as before), a request that would
// count past what Redis holds for its replica (its record's count: no
// guarantee is given while young, viewOf) waits for Redis: the replica
// claims its count, the request included, in a send of its own, and
// decides from that send's reply. Redis runs each replica's script whole,
// one after another, so each reply holds every claim made before it: two
// replicas never take the same room. One replica's requests of a young
// key decide one at a time (claiming), and each is admitted up to the
// count it claimed only (the engine's conditional add is held to it). A
// count claimed that no request took (a claim refused, a request refused
// by another limit after its claim) stays in the record, which never
// reads lower than a claim the others saw, and the next request takes it
// without a send; two requests in flight at once may find the same one,
// and the conditional add admits one of them. A request refused by this
// replica's last view asks nothing; a key past its first two intervals
// goes back to quiet shares and loud claims (allowance). A wallet does
// not claim (EstimateWallet).
//
// A request waits at most the fleet's timeout from its arrival, for its
// key's requests before it, the sends ahead of it (a round, other keys'
// claims) and its own; past it, it is decided alone at θ/N, as while
// Redis is down, and a claim that failed says nothing of Redis (the next
// round does). Where θ/N holds no whole request (every key is shared from
// its first request: sharePoint), nothing is claimed: a claim refused
// there would hold the whole limit until it halves.

// decideYoung is Estimate's answer for entry e, young: local's count
// (before the request) and add, the request's, at now. ok is false where
// the key is no longer young, or Redis went down, once the request's turn
// came: Estimate then decides it as any other.
func (f *Fleet) decideYoung(e *hotEntry, theta, local, add uint32, n int64, now time.Time) (_ uint32, ok bool) {
	tk := now.UnixNano() / int64(e.tick)
	// One request of the key at a time here, each deciding from the view
	// the one before it brought; and one send at a time. Both waits end at
	// the deadline.
	deadline := time.Now().Add(time.Duration(f.cfg.Timeout))
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case e.claiming <- struct{}{}:
	case <-t.C:
		return alone(local, theta, n), true
	}
	defer func() { <-e.claiming }()
	select {
	case f.sending <- struct{}{}:
	case <-t.C:
		return alone(local, theta, n), true
	}
	defer func() { <-f.sending }()
	v := e.view.Load()
	if !v.young || !f.up.Load() {
		return 0, false
	}
	e.rebase(tk)
	// Its count as the engine read it: what this replica admitted and
	// counted (refused ones too, where they count). A claim past it that
	// no count took (a claim refused, a request refused by another limit
	// after its claim, one in flight) is room this request may take
	// without a word; the conditional add, held to need, keeps two of
	// them from taking one.
	need := uint32(min(uint64(local)+uint64(add), math.MaxUint32))
	top, _, _ := v.bounds(theta, tk)
	switch {
	case need > top:
		// Refused by what this replica knows: no word needed.
		return refusedAt(need, add, theta, top), true
	case need <= e.claimed:
		// Redis holds this count already (above).
		return f.admitted(v, theta, local, need, n), true
	case time.Until(deadline) < time.Millisecond:
		return alone(local, theta, n), true
	}
	e.claimed = need
	e.loud.Store(true)
	ok = f.sendHeld([]*hotEntry{e}, false, time.Until(deadline), true)
	if v = e.own; !ok || e.unsynced.Load() || v == nil {
		return alone(local, theta, n), true
	}
	if top, _, _ = v.bounds(theta, tk); need > top {
		// Another replica's claim came first.
		return refusedAt(need, add, theta, top), true
	}
	return f.admitted(v, theta, local, need, n), true
}

// admitted is the estimate of a request admitted from view v up to a
// count of need: the engine's conditional add holds the local count to it
// (what Redis holds for this replica), and a suspect view to θ/N
// (Estimate).
func (f *Fleet) admitted(v *shareView, theta, local, need uint32, n int64) uint32 {
	est := uint32(min(uint64(local)+uint64(theta-min(theta, need)), math.MaxUint32))
	if v.suspect {
		est = max(est, alone(local, theta, n))
	}
	return est
}

// refusedAt is the estimate of a request refused because need, its
// count with it, passes top: past θ by as much, with or without it.
func refusedAt(need, add, theta, top uint32) uint32 {
	return uint32(min(uint64(need-min(need, add))+uint64(theta)-uint64(min(theta, top)), math.MaxUint32))
}

// rebase brings e's claim to tick tk (f.sending held): halved.
func (e *hotEntry) rebase(tk int64) {
	if tk > e.claimedTk {
		e.claimed = halve(e.claimed, tk-e.claimedTk)
		e.claimedTk = tk
	}
}
