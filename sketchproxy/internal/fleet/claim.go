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
// it: two replicas never take the same room. A claim refused still
// counts in the record (claimed), so that the record never reads lower
// than a claim the others saw; the next request that fits takes its
// place without a send. A request refused by this replica's last view
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
	want := uint64(local) + uint64(add)
	if v != nil {
		top, _, held := v.bounds(theta, tk)
		if want > uint64(top) || want <= uint64(held) {
			// Refused by what this replica knows, or within what Redis
			// holds for it: no word needed.
			return estimateAt(local, theta, top)
		}
	}
	v, c, ok := f.claim(e, local, add, now)
	if !ok {
		return alone(local, theta, n)
	}
	top, _, _ := v.bounds(theta, tk)
	if c > top {
		return theta // refused: another replica's claim came first
	}
	return estimateAt(local, theta, top)
}

// estimateAt is the estimate of a count local that may reach top of θ.
func estimateAt(local, theta, top uint32) uint32 {
	return uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
}

// claim sends e at once, its count claimed at the most this replica's
// sketch and local hold, plus add, and returns e's view after the reply
// and that count; ok is false where Redis did not answer with e's
// records. Where an earlier claim (halved), one refused, already holds
// that count in Redis, nothing is sent: the others left room for it
// since they read it, and the claims that came before it are in the
// view that refused it.
func (f *Fleet) claim(e *hotEntry, local, add uint32, now time.Time) (_ *shareView, c uint32, ok bool) {
	f.sendMu.Lock()
	tk := now.UnixNano() / int64(e.tick)
	c = uint32(min(uint64(max(local, e.sk.EstimateBytes(e.skey)))+uint64(add), math.MaxUint32))
	if c <= e.claimedAt(tk) {
		f.sendMu.Unlock()
		v := e.view.Load()
		return v, c, v != nil
	}
	e.claimed, e.claimedTk = c, tk
	e.loud.Store(true)
	f.sendMu.Unlock()
	if !f.send([]*hotEntry{e}, false) || e.unsynced.Load() {
		return nil, c, false
	}
	v := e.view.Load()
	return v, c, v != nil
}
