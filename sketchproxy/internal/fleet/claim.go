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
// So while a key is young (answered at least once: its first request
// after the promotion is decided at θ/N, as before), a request that would
// count past what Redis holds for its replica (its record's count: no
// guarantee is given while young, viewOf) waits for Redis: the replica
// claims its count, the request included, in a send of its own, and
// decides from that send's reply. Redis runs each replica's script whole,
// one after another, so each reply holds every claim made before it: two
// replicas never take the same room. One replica's requests of a young key
// decide one at a time (claimMu), each claiming its own count past those
// admitted before it, and are admitted up to that count only (the
// engine's conditional add is held to it). A claim refused still counts in
// the record (spare), so that the record never reads lower than a claim
// the others saw; the next request that fits takes its place without a
// send. A request refused by this replica's last view asks nothing; a key
// past its first two intervals goes back to quiet shares and loud claims
// (allowance).
//
// A request waits at most the fleet's timeout from its arrival, for the
// sends ahead of it (a round, other keys' claims, its key's requests
// before it) and its own; past it, it is decided alone at θ/N, as while
// Redis is down, and a claim that failed says nothing of Redis (the next
// round does). Where θ/N holds no whole request (every key is shared from
// its first request: sharePoint), nothing is claimed: a claim refused
// there would hold the whole limit until it halves.

// decideYoung is Estimate's answer for entry e, young: local's count
// (before the request) and add, the request's, at now.
func (f *Fleet) decideYoung(e *hotEntry, theta, local, add uint32, n int64, now time.Time) uint32 {
	tk := now.UnixNano() / int64(e.tick)
	// One request of the key at a time here: each decides from the view
	// the one before it brought, and claims its own count past those
	// admitted before it.
	deadline := time.Now().Add(time.Duration(f.cfg.Timeout))
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case f.sending <- struct{}{}:
	case <-t.C:
		// The sends ahead of it (a round, other keys' claims) took the
		// timeout: decided alone, as while Redis is down.
		return alone(local, theta, n)
	}
	defer func() { <-f.sending }()
	e.rebase(tk)
	need := uint32(min(uint64(max(local, e.claimed-e.spare))+uint64(add), math.MaxUint32))
	v := e.view.Load()
	top, _, _ := v.bounds(theta, tk)
	switch {
	case need > top:
		// Refused by what this replica knows, its requests admitted
		// and not yet counted included: no word needed.
		return refused(theta, add)
	case need <= e.claimed:
		// A claim refused before holds this count in Redis: the others
		// left room for it since they read it, and the claims that came
		// before it are in the view that refused it.
		e.spare -= min(e.spare, add)
		return f.admitted(v, theta, local, min(top, need), n)
	}
	e.claimed, e.spare = need, 0
	e.loud.Store(true)
	ok := f.sendHeld([]*hotEntry{e}, false, max(time.Millisecond, time.Until(deadline)), true)
	if v = e.own; !ok || e.unsynced.Load() || v == nil {
		e.spare = min(e.claimed, e.spare+add)
		return alone(local, theta, n)
	}
	if top, _, _ = v.bounds(theta, tk); need > top {
		// Another replica's claim came first.
		e.spare = min(e.claimed, e.spare+add)
		return refused(theta, add)
	}
	return f.admitted(v, theta, local, need, n)
}

// admitted is the estimate of a request admitted from view v: the local
// count may reach top (what Redis holds for it), no more, and a suspect
// view no more than θ/N (Estimate).
func (f *Fleet) admitted(v *shareView, theta, local, top uint32, n int64) uint32 {
	est := uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
	if v.suspect {
		est = max(est, alone(local, theta, n))
	}
	return est
}

// refused is an estimate that refuses a request of add: past θ with or
// without it.
func refused(theta, add uint32) uint32 {
	return uint32(min(uint64(theta)+uint64(add), math.MaxUint32))
}

// rebase brings e's claim to tick tk (f.sending held): claimed and spare
// halved.
func (e *hotEntry) rebase(tk int64) {
	if tk > e.claimedTk {
		e.claimed, e.spare = halve(e.claimed, tk-e.claimedTk), halve(e.spare, tk-e.claimedTk)
		e.claimedTk = tk
	}
}
