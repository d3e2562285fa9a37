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
// So while a key is young, a request past what Redis already holds for
// this replica (its record's count: no guarantee is given while young,
// viewOf) waits for Redis:
// the replica claims its count, the request included, in a send of its
// own, and decides from the reply. Redis runs each replica's script
// whole, one after another, so each reply holds every claim made before
// it: two replicas never take the same room. One replica's requests of
// a young key decide one at a time (claimMu), each claiming its own count
// past those admitted before it. A claim refused still counts in the
// record (spare), so that the record never reads lower than a claim the
// others saw; the next request that fits takes its place without a send. A request refused by this replica's last view
// asks nothing; a key past its first two intervals goes back to quiet
// shares and loud claims (allowance). Where Redis does not answer within
// the timeout, the request is decided alone at θ/N, as while Redis is
// down. Where θ/N holds no whole request (every key is shared from its
// first request: sharePoint), a key's first requests are decided as
// before: a claim refused there would hold the whole limit until it
// halves.

// decideYoung is Estimate's answer for young entry e (v its view, nil
// before its first answer): local's count and add, the request's, at now.
func (f *Fleet) decideYoung(e *hotEntry, v *shareView, theta, local, add uint32, n int64, now time.Time) uint32 {
	tk := now.UnixNano() / int64(e.tick)
	// One request of the key at a time here: each decides from the view
	// the one before it brought, and claims only what it needs, not past
	// claims still in flight that their replies would refuse.
	e.claimMu.Lock()
	defer e.claimMu.Unlock()
	v = e.view.Load()
	f.sendMu.Lock()
	e.settle(tk)
	need := uint32(min(uint64(max(local, e.claimed-e.spare))+uint64(add), math.MaxUint32))
	if v != nil {
		top, _, _ := v.bounds(theta, tk)
		switch {
		case need > top:
			// Refused by what this replica knows, its requests claimed
			// and not yet counted included: no word needed.
			f.sendMu.Unlock()
			return theta
		case need <= e.claimed:
			// A claim refused before holds this count in Redis: the
			// others left room for it since they read it, and the claims
			// that came before it are in the view that refused it.
			e.spare -= min(e.spare, add)
			f.sendMu.Unlock()
			return estimateAt(local, theta, top)
		}
	}
	e.claimed, e.spare = max(e.claimed, need), 0
	e.loud.Store(true)
	f.sendMu.Unlock()
	if !f.send([]*hotEntry{e}, false) || e.unsynced.Load() {
		f.refuse(e, add, tk)
		return alone(local, theta, n)
	}
	if v = e.view.Load(); v == nil {
		f.refuse(e, add, tk)
		return alone(local, theta, n)
	}
	top, _, _ := v.bounds(theta, tk)
	if need > top {
		// Another replica's claim came first.
		f.refuse(e, add, tk)
		return theta
	}
	return estimateAt(local, theta, top)
}

// refuse marks add, claimed for a request that was not admitted, as room
// e's record holds for nothing: the next request takes it.
func (f *Fleet) refuse(e *hotEntry, add uint32, tk int64) {
	f.sendMu.Lock()
	e.settle(tk)
	e.spare = min(e.claimed, e.spare+add)
	f.sendMu.Unlock()
}

// settle brings e's claim to tick tk (sendMu held): claimed and spare
// halved, and claimed at least what its sketch holds (its requests
// admitted without a claim use its spare first).
func (e *hotEntry) settle(tk int64) {
	if tk > e.claimedTk {
		e.claimed, e.spare = halve(e.claimed, tk-e.claimedTk), halve(e.spare, tk-e.claimedTk)
		e.claimedTk = tk
	}
	if c := e.sk.EstimateBytes(e.skey); c > e.claimed-e.spare {
		e.spare -= min(e.spare, c-(e.claimed-e.spare))
		e.claimed = max(e.claimed, c)
	}
}

// estimateAt is the estimate of a count local that may reach top of θ.
func estimateAt(local, theta, top uint32) uint32 {
	return uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
}
