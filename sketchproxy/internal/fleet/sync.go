package fleet

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// loop syncs every interval, and at once when entries are queued (claims,
// promotions); after a failure it waits longer, up to 1 s or two
// intervals, before the next try, and recovers at the first round that
// succeeds. The cap is short because replicas that recover at different
// times see each other's counts late. While Redis is down, queued entries
// wait for the next round.
func (f *Fleet) loop() {
	defer close(f.done)
	wait := time.Duration(f.cfg.Interval)
	f.round() // at once: learn N and whether Redis answers
	close(f.first)
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-f.kick:
			if f.up.Load() {
				f.sendPending()
			}
		case <-t.C:
			if f.round() {
				wait = time.Duration(f.cfg.Interval)
			} else {
				wait = min(2*wait, max(time.Second, 2*time.Duration(f.cfg.Interval)))
			}
			t.Reset(wait)
		}
	}
}

// round sends every hot key, with the heartbeat, and demotes the keys
// that cooled.
func (f *Fleet) round() bool {
	var es []*hotEntry
	for i := range f.shards {
		s := &f.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			es = append(es, e)
		}
		s.mu.Unlock()
	}
	for _, e := range es {
		e.pending.Store(false) // sent now
	}
	ok := f.send(es, true)
	if ok {
		f.demote(es)
	}
	return ok
}

// sendPending sends the queued entries.
func (f *Fleet) sendPending() {
	f.pmu.Lock()
	q := f.pend
	f.pend = nil
	f.pmu.Unlock()
	es := q[:0]
	for _, e := range q {
		if e.pending.Swap(false) {
			es = append(es, e)
		}
	}
	if len(es) > 0 {
		f.send(es, false)
	}
}

// send sends es (with beat, the heartbeat too) and applies the replies,
// one send at a time (a round, the queued entries, a claim: claim.go).
func (f *Fleet) send(es []*hotEntry, beat bool) bool {
	f.sending <- struct{}{}
	defer func() { <-f.sending }()
	return f.sendHeld(es, beat, time.Duration(f.cfg.Timeout), false)
}

// sendHeld is send, f.sending held, within timeout. A claim's send
// (claim.go) that fails says nothing of Redis: a request waited too long
// for it, and the next round tells whether Redis answers.
func (f *Fleet) sendHeld(es []*hotEntry, beat bool, timeout time.Duration, claim bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	now := f.now()
	interval := time.Duration(f.cfg.Interval)
	r := &shareRound{
		id: f.self, candidate: fmt.Sprintf("%s-%d", f.runID, time.Now().UnixNano()), channel: f.channel(),
		stale: f.stale(), ttl: 2 * interval,
	}
	calls := f.callsOf(es, now)
	f.sign(calls)
	var hb *heartbeat
	if beat && f.cfg.Replicas == 0 {
		hb = f.heartbeat(now, f.beatWindow())
	}
	if beat {
		r.index = f.indexOp(es, now)
	}
	sentAt, reckoned := f.redisClock(), f.redisAt.Load() != 0
	sentLocal := f.now().UnixNano()
	replies, members, sent, err := f.store.sync(ctx, r, calls, hb)
	f.commands.Add(uint64(sent))
	ran := replyTime(replies, members)
	if err == nil && ran != 0 {
		f.noteSkew(ran, sentLocal, f.now().UnixNano())
	}
	half := time.Duration(f.cfg.Timeout) / 2
	switch now, at := f.now().UnixNano(), f.outageAt.Load(); {
	case err != nil && (!claim || timeout >= half && time.Since(start) >= half):
		// Redis did not answer: not a claim sent with less than half
		// the fleet's timeout of its request's wait left (it queued
		// behind other sends), which says nothing of Redis.
		f.outageAt.Store(now)
	case err == nil && reckoned && stalled(sentAt, ran, half):
		// Answered, but Redis ran the send's first command half the
		// timeout or more after it was sent (paused, or a slow command
		// ahead of it): the others' sends in that time may have failed,
		// and what they admitted alone is not in the records this reply
		// read. An outage that ended now.
		f.outageAt.Store(now)
		f.recoveredTS.Store(f.redisClock())
		f.recoveredAt.Store(now)
	case err == nil && at > f.recoveredAt.Load():
		f.recoveredTS.Store(f.redisClock())
		f.recoveredAt.Store(max(now, at)) // not before it, whatever the clock did
	}
	peers := f.apply(es, calls, replies, err == nil)
	if claim {
		// A request's claims, not a round: a failure is a request that
		// waited too long, and says nothing of Redis.
		return err == nil
	}
	f.rounds.Add(1)
	f.roundTime.Observe(time.Since(start).Seconds())
	if err != nil {
		f.roundErrors.Add(1)
		// Once when Redis goes, and once if it never came: not every round.
		if wasUp := f.up.Swap(false); wasUp || f.lastOK.Load() == 0 && !f.warnedNeverUp {
			f.warnedNeverUp = true
			f.log.Warn("fleet: Redis unreachable: enforcing limits locally at 1/N", "err", err.Error(), "replicas", f.replicas())
			f.warnSizeUnknown()
		}
		return false
	}
	f.noteIndex(r.index)
	f.warmUntil.CompareAndSwap(0, idleWarm)
	f.rttNs.Store(int64(time.Since(start)))
	f.lastOK.Store(f.now().UnixNano())
	switch {
	case hb != nil && members != nil:
		f.noteRedisTime(members.now)
		f.noteMembers(f.countMembers(hb, members), peers)
		f.beatBroken.Store(false)
	case hb != nil:
		// Redis answered the round, but not the heartbeat (a key of
		// another type where the members are): N is the replicas the hot
		// keys' records name, those heard on the members' channel (the
		// script publishes first), and min_replicas. Before, the records were
		// skipped too, and N stayed at the first heartbeat's floor.
		f.noteMembers(f.countMembers(hb, &beatReply{now: f.redisClock()}), peers) // those heard
		if !f.beatBroken.Swap(true) {
			f.log.Warn("fleet: Redis did not answer the heartbeat with the members (a key of another type under the prefix?): N is counted from the hot keys' records and min_replicas alone", "members", hb.key, "signed_members", hb.signedKey)
		}
	}
	if !f.up.Swap(true) {
		f.log.Info("fleet: Redis reachable: enforcing fleet-wide limits", "replicas", f.replicas(), "hot_keys", f.count.Load())
	}
	return true
}

// heartbeat is this replica's heartbeat of a round at now (the test
// store's clock), signed: members not heard from within window are gone.
// The members' hash is named under the prefix (an ACL's key pattern) and
// is in the sorted set's slot (its hash tag is the set's name, which has
// none: the prefix has no braces), so that one script writes both on a
// Redis Cluster.
func (f *Fleet) heartbeat(now time.Time, window time.Duration) *heartbeat {
	hb := &heartbeat{key: f.cfg.Prefix + "members", signedKey: f.signedMembers(), id: f.self, channel: f.beatChannel(), now: now, window: window}
	f.signBeat(hb)
	return hb
}

// claimLimit is the most e's record and what the others' hold may add up
// to, at tick tk, for a claim to be written (shareScript): as e's view
// reckons it, the most this replica's count may reach plus what the
// others hold (so that the script writes a claim where the view would
// admit it, the others' records as they are when it runs). Before any
// view, θ less the promotion point for each other replica: one that has
// not shared the key yet may hold that much of it unseen (the view's
// reserve), and one that has is in the records besides (a claim refused
// so is sent again from the reply's view: claim.go).
func (f *Fleet) claimLimit(e *hotEntry, tk int64) uint32 {
	v := e.view.Load()
	if v == nil || v.tick > tk {
		n := f.replicas()
		held := uint64(max(0, n-1)) * uint64(sharePoint(e.theta, n, f.cfg.PromoteFraction))
		return e.theta - uint32(min(held, uint64(e.theta)))
	}
	top, _ := v.allowance(e.theta, tk)
	held := uint64(top)
	for _, p := range v.others {
		held += uint64(max(halve(p.c, tk-v.tick), p.g))
	}
	return uint32(min(held, math.MaxUint32))
}

// callsOf is what a send writes of each of es at now: its count, its
// demand, the guarantee to store, and whether it publishes a claim.
func (f *Fleet) callsOf(es []*hotEntry, now time.Time) []shareCall {
	calls := make([]shareCall, len(es))
	for i, e := range es {
		// Never less than its claims: the others decided on them.
		at := now.UnixNano() / int64(e.tick)
		e.cmu.Lock()
		e.rebase(at)
		// The requests in flight that hold room count too (read
		// before the count, as need does). The count is read at now's
		// tick, the one the record is dated at: the sketch's own
		// follows the wall clock late at a tick's end, and a count read
		// there and dated at the next tick halves a tick late in every
		// reader's view (too many refused).
		c := uint32(min(max(uint64(e.granted), uint64(e.handed)+uint64(e.sk.EstimateBytesAt(now, e.skey))), math.MaxUint32))
		at = max(at, e.claimTk) // a claim dated a moment later
		var c1 uint32
		if e.claim > c {
			c1 = e.claim
		}
		e.claim = 0
		e.cmu.Unlock()
		calls[i] = shareCall{rkey: e.rkey, marker: e.marker, tick: e.tick,
			c: c, d: e.demandAt(now), g: e.gWant,
			at: at, publish: e.loud.Swap(false), c1: c1, restore: e.restore}
		if c1 > 0 {
			calls[i].limit = f.claimLimit(e, at)
		}
	}
	return calls
}

// apply applies the replies to a send of es (calls, what it wrote):
// each synced key's view, and the guarantee to store next. answered: the
// send had no error, so a key without a reply is one Redis answered with
// something else. It returns the most replicas a key's records named.
func (f *Fleet) apply(es []*hotEntry, calls []shareCall, replies []shareReply, answered bool) (peers int64) {
	// Keys whose node answered are synced even when another node did not
	// (Redis Cluster). A tag whose marker changed lost its records (with
	// Redis Cluster, one node can): every replica writes its record whole
	// at each round, so nothing is resent; until all have, the key's
	// first rounds hold room for the missing ones (guarantee).
	lost := 0
	synced := 0
	for i, e := range es {
		rp := &replies[i]
		if !rp.ok {
			if c1 := calls[i].c1; c1 > 0 {
				e.grant(c1, calls[i].at) // the send may have written it
			}
			if answered && !e.unsynced.Swap(true) {
				f.log.Warn("fleet: Redis answered, but not with a hot key's records (a key of another type under the prefix?): the key is decided here at its fair share until it syncs", "key", e.rkey)
			}
			continue
		}
		e.unsynced.Store(false)
		if calls[i].publish {
			// Published by the script: a send that failed publishes its
			// claim again at the next, and counts it then.
			f.claims.Add(1)
		}
		if calls[i].restore != nil {
			e.restore = nil // written back, where still missing
		}
		if old, seen := f.run[e.marker]; seen && old != rp.run {
			lost++
			f.restoreLost(e.marker)
		}
		f.run[e.marker] = rp.run
		synced++
		f.noteRedisTime(rp.now)
		e.gSent = calls[i].g
		v, g := f.viewOf(e, rp, e.gSent, nil)
		e.peerRecs = e.peerRecs[:0]
		for _, r := range rp.recs { // believed (peersOf)
			if r.id != f.self {
				e.peerRecs = append(e.peerRecs, r)
			}
		}
		peers = max(peers, livePeers(rp.peers, rp.now, f.stale()))
		e.own = v
		e.answered.Store(true)
		written := calls[i].c
		if c1 := calls[i].c1; c1 > 0 && rp.wrote(f.self, c1) {
			written = c1
			e.grant(c1, calls[i].at)
		}
		e.confirm(written, calls[i].at)
		f.store1(e, v)
		e.gWant = g // stored at the next round: until then the pool holds its room
	}
	if lost > 0 {
		f.resends.Add(1)
		f.log.Warn("fleet: Redis lost the shared counts (restarted empty): every replica writes its own again", "keys", lost)
	}
	f.keySyncs.Add(uint64(synced))
	return peers
}

// livePeers is how many of peers wrote their records within stale of
// now (Redis's time, µs): the replicas a key's records name, N's floor.
// A record unwritten longer is a replica gone (its count stays until it
// halves away, and a replica restarted under a new name has a record of
// its predecessor's for as long): it is not counted.
func livePeers(peers []peerShare, now int64, stale time.Duration) int64 {
	var n int64
	for _, p := range peers {
		if p.ts >= now-int64(stale/time.Microsecond) {
			n++
		}
	}
	return n
}

// liveReplicas is how many of n replicas a key just shared holds room
// for (shareView.virtual): those the last heartbeat counted (and
// min_replicas), not the most seen lately, which is N's floor. A replica
// restarted under a new name is counted twice until its predecessor's
// heartbeat leaves the window, and N keeps that count for two periods
// more: room held that long for a replica that does not exist refused a
// client under its limit (16 of 19 requests of a burst of 20, in a
// review's test).
func (f *Fleet) liveReplicas(n int64) int64 {
	if f.cfg.Replicas > 0 || !f.up.Load() {
		return n
	}
	return min(n, max(1, f.n.Load(), int64(f.cfg.MinReplicas)))
}

// recovering reports whether this replica saw Redis not answer (or
// answer only after half the timeout: send) and has not had its answers
// for long since: for the longest backoff of a
// replica whose rounds failed (loop), a round and a timeout after the
// first send Redis answered, the time every replica's round takes to
// write its record whole once Redis answers it again; or, where N is
// counted from the heartbeats, until every other replica has beaten
// since (its round wrote its records then), two intervals and a timeout
// at least. Ending at the heartbeats alone read 21 of 20 once for Redis
// paused at a key's birth (TestFleetProcessPausedAtBirth under -race
// with a core kept busy).
func (f *Fleet) recovering() bool {
	now := f.now().UnixNano()
	at, rec := f.outageAt.Load(), f.recoveredAt.Load()
	if at == 0 {
		return false
	}
	// A wall clock stepped back: what reads later than now is now, so
	// that the window is not as long as the step.
	if at > now {
		f.outageAt.CompareAndSwap(at, now)
		at = now
	}
	if rec > now {
		f.recoveredAt.CompareAndSwap(rec, now)
		rec = now
	}
	if rec < at {
		return true
	}
	i, since := time.Duration(f.cfg.Interval), time.Duration(now-rec)
	if b := f.beatSeen.Load(); since >= 2*i+time.Duration(f.cfg.Timeout) && f.cfg.Replicas == 0 &&
		b != nil && b.others >= f.replicas()-1 && b.oldest >= f.recoveredTS.Load() {
		// Every other replica has beaten since: its round wrote its
		// records whole, what it promoted while Redis was down too
		// (promoteDown).
		return false
	}
	return since < max(time.Second, 2*i)+i+time.Duration(f.cfg.Timeout)
}

// stalled reports whether Redis ran a send's first command d or more
// after sentAt (this replica's reckoning of Redis's time when it sent it,
// µs), by ran, the time the first reply carries (replyTime; 0: none): how
// long Redis held the send before running it, not how long a round of
// many hot keys takes to run.
func stalled(sentAt, ran int64, d time.Duration) bool {
	return ran > 0 && ran-sentAt >= d.Microseconds()
}

// restoreLost is told that Redis lost the records of the hot keys under
// marker's hash tag (restarted empty, flushed). Each such key writes back
// at its next send, sent at once, the other replicas' records it last
// read, where Redis still has none of theirs (a record is its writer's
// count, signed, dated at its tick: it halves as it would have, and a
// replica's own write replaces it): a replica restarted without a
// state_file just before had counted nothing of what its previous self
// admitted, which only Redis held, and took it again (27 of 20 in a
// review). And the index of heavy keys went with the records: every hot
// key is marked again at the next round, not a generation (a minute)
// later, which left a replica restarted meanwhile without it (2 more of a
// key held at its limit, in a review). Under f.sending.
//
// Once an interval per tag at most: anyone who may write under the prefix
// can change a marker, and each change had every replica send every hot
// key of its tag again at once, as fast as the changes came (a review);
// now at most one send more a key an interval.
func (f *Fleet) restoreLost(marker string) {
	now := f.now().UnixNano()
	if at, ok := f.restoredAt[marker]; ok && now-at < int64(time.Duration(f.cfg.Interval)) && now >= at {
		return
	}
	f.restoredAt[marker] = now
	for i := range f.shards {
		sh := &f.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			e.indexGen.Store(0)
			if e.marker == marker && len(e.peerRecs) > 0 {
				e.restore = slices.Clone(e.peerRecs[:min(len(e.peerRecs), maxRestore)])
				f.sendSoon(e, false)
			}
		}
		sh.mu.Unlock()
	}
}

// maxRestore is how many other replicas' records a send writes back at
// most (shareScript takes no more).
const maxRestore = 64

// replyTime is Redis's time (µs) when it ran a send's first command that
// answered: its first key's reply, or else the heartbeat's; 0 for none.
func replyTime(replies []shareReply, members *beatReply) int64 {
	for i := range replies {
		if replies[i].ok && replies[i].now > 0 {
			return replies[i].now
		}
	}
	if members != nil {
		return members.now
	}
	return 0
}

// beatWindow is how long a heartbeat counts its replica: three
// intervals and a second.
func (f *Fleet) beatWindow() time.Duration { return 3*time.Duration(f.cfg.Interval) + time.Second }

// stale is how long a replica's record outlives its last write: a
// replica gone (or one whose key cooled) gives its guarantee back then.
func (f *Fleet) stale() time.Duration { return 4*time.Duration(f.cfg.Interval) + time.Second }

// idleWarm is warmUntil from this replica's first answer from Redis to its
// first request: in its warm-up, however long it waits for traffic.
const idleWarm = math.MaxInt64

// viewOf builds e's view from a reply to this replica's send (own: gSent
// is the guarantee it stored) or from a claim heard (cur is the view it
// replaces). It returns the view and the guarantee the reply computes.
// A guarantee shrinks at once; it grows only once Redis holds it, so that
// the guarantees Redis holds always cover the ones in use.
func (f *Fleet) viewOf(e *hotEntry, rp *shareReply, gSent uint32, cur *shareView) (*shareView, uint32) {
	n := f.replicas()
	live := f.liveReplicas(n) // held room for while a key is young (virtual)
	prev := cur
	if prev == nil {
		prev = e.view.Load()
	}
	var suspect, kept bool
	rp.peers, suspect = f.peersOf(e.rkey, rp, prev)
	rp.peers, kept = keepPeers(rp.peers, prev, rp.tick)
	// A key is young here while this replica shared it less than two
	// intervals ago (promoted lately, not a record whose hash was deleted
	// under a key long hot): its requests claim (claim.go) where θ/N
	// holds a whole request. That is this replica's own word: Redis's
	// born is unsigned, and one rewritten to long ago by a writer without
	// the secret would stop the claims of a key just shared (23 to 26 of
	// a burst of 20, TestFleetSimBurstAtBirth). Room is held for the
	// replicas not yet present while either says the key is young, and
	// they are held at their share of the pool while this replica's word does
	// (a key long hot here whose records were flushed is not held so).
	bornYoung := time.Duration(rp.now-rp.born)*time.Microsecond < 2*time.Duration(f.cfg.Interval)
	vyoung := f.now().UnixNano()-e.since < int64(2*f.cfg.Interval)
	young := bornYoung || vyoung
	point := sharePoint(e.theta, n, f.cfg.PromoteFraction)
	if !vyoung || !bornYoung {
		// No guarantee is given while a key is young (below), so none
		// of the others' is raised to the apportionment then; but a key
		// Redis calls old may be long shared elsewhere, its guarantees
		// in use, and this replica's claims keep clear of them.
		rp.peers = othersApportioned(f.self, rp.peers, int(n), young, e.theta, point, e.rkey)
	}
	g, reserve, split := guarantee(f.self, rp.peers, int(n), young, e.theta, point, e.rkey)
	// A claim carries only the records that verify: it never clears a
	// suspect view, which only a round that reads every record whole does.
	// Nor do the records while this replica is recovering from a moment
	// Redis did not answer it: every replica may have decided alone at
	// its θ/N since (as during an outage), and its record holds that only
	// from its next round. Views of Redis paused in the middle of a key's
	// birth, trusted at once, let the replicas that claimed after it take
	// the room the others had admitted alone (21 and 22 of a burst of 20
	// on the fleet sim, TestFleetSimPausedAtBirth; 18 to 26 through a real
	// redis-server paused 0.3 s).
	suspect = suspect || kept || rp.claim && prev != nil && prev.suspect || f.recovering()
	v := &shareView{tick: rp.tick, at: rp.now, reserve: reserve, n: split, suspect: suspect, forged: rp.rejected > 0 && !rp.claim}
	v.young = vyoung
	if vyoung {
		// No guarantee while young: every count past what Redis holds
		// for this replica is claimed, and a guarantee would hold room
		// its replica may not use (2 replicas at 9 counts of guarantees
		// of 10 each, θ 20, leave the last request to no one).
		g = 0
	}
	// This replica is never one of the virtual replicas (presentWith).
	if present := presentWith(rp.peers, f.self); vyoung && present < int(live) {
		v.virtual = uint32(int(live) - present)
	}
	for _, p := range rp.peers {
		if p.id == f.self {
			v.meC = p.c
			continue
		}
		v.others = append(v.others, p)
		v.sumGo += p.g
	}
	if prev != nil && prev.tick <= rp.tick {
		// This replica's own count, as a claim heard says Redis holds
		// it, is no less either (keepPeers).
		v.meC = max(v.meC, halve(prev.meC, rp.tick-prev.tick))
	}
	switch {
	case cur != nil:
		v.g = min(cur.g, g)
	default:
		v.g = min(gSent, g)
	}
	return v, g
}

// store1 installs v, from a reply to this replica's own round, unless a
// later view is in place (a claim heard after the reply was sent). A
// claim can be later than the reply by the time until the reply came
// (less than a timeout); one later than that was not written by the
// script, and the reply replaces it.
func (f *Fleet) store1(e *hotEntry, v *shareView) {
	for {
		cur := e.view.Load()
		if cur != nil && cur.at > v.at && cur.at <= v.at+int64(time.Duration(f.cfg.Timeout)/time.Microsecond) {
			return
		}
		if e.view.CompareAndSwap(cur, v) {
			return
		}
	}
}

// demote drops hot keys that cooled here and fleet-wide: the local count
// and the demand below a quarter of the promotion point, nothing counted
// elsewhere above it, and nothing left to send. Redis drops the key's
// record once it halves to nothing.
func (f *Fleet) demote(es []*hotEntry) {
	now := f.now()
	n := f.replicas()
	for _, e := range es {
		p := sharePoint(e.theta, n, f.cfg.PromoteFraction)
		q := max(1, p/4)
		tk := now.UnixNano() / int64(e.tick)
		if e.sk.EstimateBytes(e.skey) >= q || e.demandAt(now) >= q || e.pending.Load() {
			continue
		}
		if v := e.view.Load(); v != nil {
			var others uint32
			for _, o := range v.others {
				others += halve(o.c, tk-v.tick)
			}
			if others >= max(1, p) {
				continue
			}
		}
		s := f.shard(e.skey)
		s.mu.Lock()
		if s.m[string(e.skey)] == e {
			f.drop(s, e)
		}
		s.mu.Unlock()
	}
}

// drop removes e from the hot set; s is e's shard, locked.
func (f *Fleet) drop(s *hotShard, e *hotEntry) {
	delete(s.m, string(e.skey))
	f.count.Add(-1)
	f.demotions.Add(1)
	f.rmu.Lock()
	delete(f.rkeys, e.rkey)
	f.rmu.Unlock()
}
