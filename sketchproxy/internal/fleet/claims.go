package fleet

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// hear applies a claim another replica published: the key's records as
// the script read them, merged into what this replica knew of the others.
// Anyone allowed to PUBLISH on the channel can send a claim, so a claim
// is only the records in it whose MAC verifies (fleet.verify): one with
// none, or with nothing later than this replica knew, is dropped. Its
// tick and time are the latest its records signed, not its head's: an
// unsigned head dated a tick later would halve every count once more.
func (f *Fleet) hear(payload string) {
	rkey, rp, ok := parseClaim(payload)
	if !ok {
		f.reject(1)
		return
	}
	if !f.plausible(rp) || !f.claimTime(rkey, &rp) {
		return
	}
	f.claimsHeard.Add(1)
	f.rmu.Lock()
	e := f.rkeys[rkey]
	if e == nil {
		if len(f.heard) >= heardMax {
			clear(f.heard)
		}
		f.heard[rkey] = rp
		f.rmu.Unlock()
		return
	}
	f.rmu.Unlock()
	if !tickFits(e, &rp) {
		return
	}
	for {
		cur := e.view.Load()
		if cur != nil && !newsTo(cur, &rp, f.self) {
			return
		}
		v, _ := f.viewOf(e, &rp, 0, cur)
		if cur == nil {
			v.g = 0 // no guarantee before this replica's own round stores one
		}
		if e.view.CompareAndSwap(cur, v) {
			return
		}
	}
}

// claimTime keeps a claim's records whose MAC verifies, the latest of
// each replica's (a claim made up of genuine records may repeat one, which
// would count its replica twice), and dates it by them: its tick, the
// latest tick a record was written at; its time, its head's within what
// its records signed (from the latest signed time to a timeout after it,
// the most a send takes). It reports false, and counts the claim
// rejected, where no record verifies.
func (f *Fleet) claimTime(rkey string, rp *shareReply) bool {
	recs, bad := rp.recs[:0], 0
	for _, r := range rp.recs {
		if !f.verify(rkey, &r) {
			bad++
			continue
		}
		switch i := slices.IndexFunc(recs, func(o signedRec) bool { return o.id == r.id }); {
		case i < 0:
			recs = append(recs, r)
		case r.ts > recs[i].ts:
			recs[i] = r
		}
	}
	f.reject(bad)
	rp.recs, rp.verified = recs, true
	if len(recs) == 0 {
		return false
	}
	tick, ts := recs[0].at, recs[0].ts
	for _, r := range recs[1:] {
		tick, ts = max(tick, r.at), max(ts, r.ts)
	}
	rp.tick = tick
	rp.now = min(max(rp.now, ts), ts+int64(time.Duration(f.cfg.Timeout)/time.Microsecond))
	return true
}

// newsTo reports whether a claim holds a record of another replica later
// (signed at a later time) than what view v knows of it: each replica's
// records are signed at increasing times, so a claim with none is one
// this replica has seen, or a replay.
func newsTo(v *shareView, rp *shareReply, self string) bool {
	for _, r := range rp.recs {
		if r.id == self {
			continue
		}
		i := slices.IndexFunc(v.others, func(p peerShare) bool { return p.id == r.id })
		if i < 0 || r.ts > v.others[i].ts {
			return true
		}
	}
	return false
}

// peersOf reads rp's records (from a reply to this replica's own round,
// or a claim) into what this replica believes, halved to rp.tick from
// the tick each was signed at:
//   - a record whose MAC does not verify, or that has none, is not
//     believed: it is read as missing, which keepPeers treats as deleted
//     (what was known of it is kept). Neither a made-up record (a replica
//     that does not exist, a huge count) nor one rewritten lower counts.
//     In a reply, one such record makes the view suspect (the key decided
//     at the stricter of its share and θ/N): a reader that never knew the
//     replica would otherwise apportion the key as if it were not there.
//   - a record signed before the one prev knows (each replica signs later
//     at each send): in a reply, Redis holds an older record than one
//     read before, a replay, read as missing and the view suspect; in a
//     claim, one that a later round or claim overtook, read as what prev
//     knew of it.
//   - a record signed more than stale ago (by Redis's time) gives back
//     its demand and guarantee: its replica left (shareScript).
//   - a claim's silence on a replica says nothing of it: what prev knew
//     stays (a claim is news, not the whole key; this replica's own
//     rounds read the whole key).
//
// This replica's own record in a reply is what it just sent.
func (f *Fleet) peersOf(rkey string, rp *shareReply, prev *shareView) (_ []peerShare, suspect bool) {
	stale := int64(f.stale() / time.Microsecond)
	out := make([]peerShare, 0, len(rp.recs)+1)
	rejected := 0
	kept := rp.recs[:0] // rp.recs keeps only the records believed
	defer func() { rp.recs = kept }()
	for _, r := range rp.recs {
		own := r.id == f.self && !rp.claim
		if !own && !rp.verified && !f.verify(rkey, &r) {
			rejected++
			rp.rejected++
			suspect = suspect || !rp.claim
			continue
		}
		p := peerShare{id: r.id, c: halve(r.c, rp.tick-r.at), d: halve(r.d, rp.tick-r.at-1), g: r.g, ts: r.ts}
		if !own && r.ts < rp.now-stale {
			p.d, p.g = 0, 0
		}
		if k, ok := knownPeer(prev, r.id, rp.tick); ok && r.ts < k.ts {
			if !rp.claim {
				suspect = true // Redis holds an older record than one read before: a replay
				continue
			}
			p = k
		}
		kept = append(kept, r)
		if own || r.id == f.self || p.c > 0 || p.d > 0 {
			out = append(out, p)
		}
	}
	f.reject(rejected)
	if rp.claim && prev != nil {
		for _, p := range prev.others {
			if !slices.ContainsFunc(out, func(o peerShare) bool { return o.id == p.id }) {
				if k, _ := knownPeer(prev, p.id, rp.tick); k.c > 0 || k.d > 0 {
					out = append(out, k)
				}
			}
		}
	}
	return out, suspect
}

// knownPeer is what view v knew of replica id, halved to tick as
// keepPeers keeps a record (its demand a tick slower).
func knownPeer(v *shareView, id string, tick int64) (peerShare, bool) {
	if v == nil {
		return peerShare{}, false
	}
	i := slices.IndexFunc(v.others, func(p peerShare) bool { return p.id == id })
	if i < 0 {
		return peerShare{}, false
	}
	p, age := v.others[i], tick-v.tick
	return peerShare{id: id, c: halve(p.c, age), d: halve(p.d, age-1), g: p.g, ts: p.ts}, true
}

// sign dates and signs this replica's records of one send: ts, its
// reckoning of Redis's time (the latest a reply carried, plus the time
// since; before any, its own clock: a record dated 0 would read as a
// replica gone, and a claim of it as from another tick), later than the
// last send's; the MAC, over the key's name and everything the record
// says.
func (f *Fleet) sign(calls []shareCall) {
	f.lastTS = max(f.redisClock(), f.lastTS+1)
	for i := range calls {
		c := &calls[i]
		c.ts = f.lastTS
		c.mac = f.macOf(c.rkey, &signedRec{id: f.self, c: c.c, d: c.d, g: c.g, at: c.at, ts: c.ts})
		if c.c1 > 0 {
			c.mac1 = f.macOf(c.rkey, &signedRec{id: f.self, c: c.c1, d: c.d, g: c.g, at: c.at, ts: c.ts})
		}
	}
}

// redisClock is this replica's reckoning of Redis's time (µs): the latest
// a reply carried, plus the time since; before any, its own clock.
func (f *Fleet) redisClock() int64 {
	if at := f.redisAt.Load(); at != 0 {
		return at + max(0, f.now().UnixNano()-f.redisSeen.Load())/int64(time.Microsecond)
	}
	return f.now().UnixMicro()
}

// noteRedisTime records Redis's time now (µs), from a reply. It moves
// forward, but for a jump back of more than redisClockBack: another
// node's clock (a failover), by which every heartbeat dated on the old
// one would read as from the future, and be dropped by the others'.
func (f *Fleet) noteRedisTime(now int64) {
	if at := f.redisAt.Load(); now > at || now < f.redisClock()-redisClockBack.Microseconds() {
		f.redisSeen.Store(f.now().UnixNano())
		f.redisAt.Store(now)
	}
}

// noteSkew takes Redis's time at (µs) from a reply to a send this replica
// made at sent and had back at got (f.now, ns): Redis ran it between
// them, so this replica's clock is off Redis's by between at-got and
// at-sent. Where the skew reckoned lies outside that (a millisecond aside
// for TIME's rounding), it moves to the nearer end: the least skew the
// reply shows, never more. A clock that agrees with Redis's reads 0
// however slow a reply (a first one that waited on its dial, 400 ms,
// read as a skew of 200 ms where it was 5, in a review). Replicas count
// on their own clocks, and Redis dates the records on its own: a skew
// moves the moments a replica's counts halve off the others'
// (docs/fleets.md, Clocks), so one past clockSkewWarn is warned, once
// until it falls under half that.
func (f *Fleet) noteSkew(at, sent, got int64) {
	lo, hi := at*int64(time.Microsecond)-got, at*int64(time.Microsecond)-sent
	if lo > hi {
		return // the clock went back during the send
	}
	const slack = int64(time.Millisecond)
	c := f.skew.Load()
	switch {
	case c < lo-slack:
		c = lo
	case c > hi+slack:
		c = hi
	default:
		return
	}
	f.skew.Store(c)
	d := time.Duration(c).Abs()
	if d <= clockSkewWarn/2 {
		f.skewWarned.Store(false)
		return
	}
	if d > clockSkewWarn && !f.skewWarned.Swap(true) {
		way := "behind"
		if c < 0 {
			way = "ahead of"
		}
		f.log.Warn(fmt.Sprintf("fleet: this replica's clock is %v %s Redis's: its counts halve at other moments than the other replicas' and Redis's, and the fleet may admit more than its limit (docs/fleets.md, Clocks); keep the replicas' and Redis's clocks in sync (NTP)", d.Round(time.Millisecond), way),
			"skew_seconds", time.Duration(c).Seconds())
	}
}

// clockSkewWarn is the skew past which a replica warns of its clock.
const clockSkewWarn = 100 * time.Millisecond

// redisClockBack is how far Redis's time may read behind this replica's
// reckoning of it before the reckoning follows it back: more than a
// reply's time in flight and the replicas' rounds apart.
const redisClockBack = time.Second

// signBeat dates and signs this replica's heartbeat: its entry in the
// members' hash is the MAC of a record of its id with no counts, dated
// ts, under the hash's name (no key's record has that name).
func (f *Fleet) signBeat(hb *heartbeat) {
	hb.ts = f.redisClock()
	hb.mac = f.macOf(hb.signedKey, &signedRec{id: hb.id, ts: hb.ts})
}

// countMembers is how many replicas the heartbeat's reply br names with
// entries that verify and that were signed within window of Redis's
// time (a timeout past it at most: a reckoning of it is never ahead by
// more), this replica at least. Entries that do not verify are counted
// as rejected records: written without the secret, or replayed from
// before the window.
// The heartbeats heard on the members' channel within the window count
// too: a members' hash flushed or deleted as often as the replicas beat
// (every 200 ms, at an interval of 500 ms) showed the replica that beat
// just before the others only itself (theirs written an interval
// earlier, a flush since), which then counted itself alone once the most
// seen lately had passed.
func (f *Fleet) countMembers(hb *heartbeat, br *beatReply) int64 {
	from, to := f.beatSpan(br.now, hb.window)
	latest := map[string]int64{}
	rejected := 0
	for _, m := range br.members {
		if m.id == hb.id {
			continue
		}
		if m.ts < from || m.ts > to || !f.verify(hb.signedKey, &signedRec{id: m.id, ts: m.ts, mac: m.mac}) {
			rejected++
			continue
		}
		latest[m.id] = max(latest[m.id], m.ts)
	}
	f.reject(rejected)
	f.bmu.Lock()
	for id, b := range f.beatsHeard {
		switch {
		case b.ts < from:
			delete(f.beatsHeard, id) // out of the window: gone, or to be heard again
		case b.ts > to:
			// Dated ahead of Redis (signed on a clock ahead, before its
			// replica's first reply): kept, it would hold off every
			// later heartbeat of that replica for as long as it is ahead.
			delete(f.beatsHeard, id)
		case b.left:
			delete(latest, id) // its entry in the hash is from before it left
		case id != hb.id:
			latest[id] = max(latest[id], b.ts)
		}
	}
	f.bmu.Unlock()
	oldest := int64(math.MaxInt64)
	for _, ts := range latest {
		oldest = min(oldest, ts)
	}
	n := 1 + int64(len(latest)) // this replica, whose entry the script wrote before it read
	f.beatSeen.Store(&beatSeen{others: n - 1, oldest: oldest})
	return n
}

// beatSpan is when a heartbeat counted at Redis's time now (µs) was
// signed: within window before now, and a timeout after it at most (a
// reckoning of Redis's time is never ahead by more).
func (f *Fleet) beatSpan(now int64, window time.Duration) (from, to int64) {
	return now - window.Microseconds(), now + time.Duration(f.cfg.Timeout).Microseconds()
}

// beatsHeldMax is the most heartbeats heard that a replica keeps between
// two of its own: every one verified, so only genuine replicas' (each
// start of one is a new id), pruned to the window at each count.
const beatsHeldMax = 4096

// heardBeat is the latest heartbeat heard of a replica (Redis's µs), or
// its leave (left): a heartbeat no later than its leave is not counted.
type heardBeat struct {
	ts   int64
	left bool
}

// hearBeat keeps a heartbeat another replica published ("id ts mac"), or
// its leave at close ("id ts mac left"), if its MAC verifies and, for a
// heartbeat, it was signed within the heartbeat's window of this replica's
// reckoning of Redis's time (a timeout ahead at most): anyone allowed to
// PUBLISH on the channel can send one, but none made up verifies, one
// replayed from before the window is rejected (as the members' hash's
// entries are: kept, old ones filled beatsHeldMax in a review), and a
// leave is signed apart (signLeave) and only of a replica that stopped
// (each start is a new id), so a leave heard ends its replica's count
// whatever its date (a leave dated before its last heartbeat, the
// reckoning moved back by a failover, was ignored).
func (f *Fleet) hearBeat(payload string) {
	if f.cfg.Replicas > 0 {
		return // N is set: no heartbeat is counted
	}
	w := strings.Fields(payload)
	left := len(w) == 4 && w[3] == "left"
	if len(w) != 3 && !left {
		f.reject(1)
		return
	}
	ts, err := strconv.ParseInt(w[1], 10, 64)
	if err != nil {
		f.reject(1)
		return
	}
	if w[0] == f.self {
		return
	}
	r := &signedRec{id: w[0], ts: ts, mac: w[2]}
	if left {
		r.c = 1
	}
	if !f.verify(f.signedMembers(), r) {
		f.reject(1)
		return
	}
	if !left && f.redisAt.Load() != 0 {
		// Before this replica's first reply there is nothing to check
		// against: a count drops what is out of the window. A leave is
		// not checked: one replayed ends only the count of a replica
		// that stopped, and one dated out of the window (the leaver's
		// reckoning apart from this replica's) still ends it.
		if from, to := f.beatSpan(f.redisClock(), f.beatWindow()); ts < from || ts > to {
			f.reject(1)
			return
		}
	}
	f.bmu.Lock()
	defer f.bmu.Unlock()
	cur, ok := f.beatsHeard[w[0]]
	switch {
	case !ok && len(f.beatsHeard) >= beatsHeldMax:
		// The next count prunes those out of the window.
	case left:
		f.beatsHeard[w[0]] = heardBeat{ts: max(ts, cur.ts), left: true}
	case !ok, ts > cur.ts:
		f.beatsHeard[w[0]] = heardBeat{ts: ts}
	}
}

// signLeave dates and signs hb as this replica's leave: the record of its
// id with a count of 1 (a heartbeat's is 0), so that no heartbeat heard
// reads as a leave.
func (f *Fleet) signLeave(hb *heartbeat) {
	hb.ts = f.redisClock()
	hb.mac = f.macOf(hb.signedKey, &signedRec{id: hb.id, c: 1, ts: hb.ts})
}

// beatSeen is what a heartbeat's reply showed of the other replicas: how
// many it counted, and the oldest of their entries (Redis's µs).
type beatSeen struct {
	others, oldest int64
}

// recMACSize is a record's MAC, truncated HMAC-SHA256 (bytes).
const recMACSize = 16

// macOf is the MAC of record r of key rkey, in hex.
func (f *Fleet) macOf(rkey string, r *signedRec) string {
	m := f.macs.Get().(hash.Hash)
	defer f.macs.Put(m)
	m.Reset()
	var b [40]byte
	binary.LittleEndian.PutUint32(b[0:], uint32(len(rkey)))
	m.Write(b[:4])
	m.Write([]byte(rkey))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(r.id)))
	m.Write(b[:4])
	m.Write([]byte(r.id))
	binary.LittleEndian.PutUint32(b[0:], r.c)
	binary.LittleEndian.PutUint32(b[4:], r.d)
	binary.LittleEndian.PutUint32(b[8:], r.g)
	binary.LittleEndian.PutUint64(b[12:], uint64(r.at))
	binary.LittleEndian.PutUint64(b[20:], uint64(r.ts))
	m.Write(b[:28])
	var sum [sha256.Size]byte
	return hex.EncodeToString(m.Sum(sum[:0])[:recMACSize])
}

// verify reports whether r is a record of key rkey that a replica with
// the fleet's secret signed.
func (f *Fleet) verify(rkey string, r *signedRec) bool {
	return !r.unsigned && hmac.Equal([]byte(f.macOf(rkey, r)), []byte(r.mac))
}

// reject counts n records not believed, and says so in the log at most
// once a minute.
func (f *Fleet) reject(n int) {
	if n <= 0 {
		return
	}
	total := f.rejected.Add(uint64(n))
	now, last := f.now().UnixNano(), f.rejectLogged.Load()
	if (last == 0 || now-last >= int64(time.Minute)) && f.rejectLogged.CompareAndSwap(last, now) {
		f.log.Warn("fleet: records or claims without a valid MAC ignored: written without the fleet's secret, or by a replica older than signed records (docs/fleets.md, Signed records)", "rejected_total", total)
	}
}

// plausible reports whether a claim heard could be one the script
// published: not from later than Redis's clock can be now (the last time
// a reply of this replica's own read on it, plus the time since, plus a
// timeout). Anyone allowed to PUBLISH on the channel can send a claim; one
// dated in the future would hold the key's view against this replica's
// own rounds (a view is replaced only by a later one) for as long as the
// key stays hot. Before any reply there is nothing to check against:
// store1 replaces such a view at the replica's own round.
func (f *Fleet) plausible(rp shareReply) bool {
	at, seen := f.redisAt.Load(), f.redisSeen.Load()
	if at == 0 {
		return true
	}
	since := max(0, f.now().UnixNano()-seen) / int64(time.Microsecond)
	return rp.now <= at+since+int64(time.Duration(f.cfg.Timeout)/time.Microsecond)
}

// tickFits reports whether a claim's tick is the one its time falls in
// for e's limit, as the script computes it: a claim with a later tick
// would have this replica halve the others' counts to nothing.
func tickFits(e *hotEntry, rp *shareReply) bool {
	us := int64(e.tick / time.Microsecond)
	if us <= 0 {
		return true
	}
	d := rp.tick - rp.now/us
	return d >= -1 && d <= 1
}
