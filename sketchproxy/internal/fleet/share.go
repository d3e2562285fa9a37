package fleet

import (
	"hash/fnv"
	"math"
	"slices"
)

// This file is the fleet's arithmetic, apart from Redis and the engine: how
// one hot key's threshold θ is cut into the replicas' shares, and how much
// of it this replica may count now. It is pure (no clock, no I/O), so that
// it is tested alone and can serve any limiter that counts with a
// conditional add, as package limit's replicas could (docs/fleets.md).
//
// Each replica's count of a hot key is in its own sketch; Redis holds, per
// replica, that count (c), the replica's demand (d: every request it saw,
// admitted or not, 2 counts a request, as a rate: the halving count at the
// start of the tick, doubled; fleet.go, demand) and its guarantee (g). All counts halve every tick, everywhere, on the same
// Unix-anchored ticks, so the fleet's count is the sum of the replicas'.
//
//   - The guarantee: θ's requests are apportioned to the replicas in
//     proportion to their demand (largest remainders, in an order that only
//     a clearly larger claim changes). A replica whose own count stays
//     within its guarantee needs no word from anyone: the guarantees add up
//     to at most θ, so the fleet's count does too. A replica held at its
//     guarantee g admits g/4 requests a tick on average (the count halves
//     from g to g/2 and refills), exactly as one replica holding θ admits
//     θ/4: guarantees that add up to θ admit the limit.
//   - The pool: what no guarantee holds. A replica counts past its
//     guarantee (and past what Redis holds for it already) from the pool
//     only while the room it knows of lasts, and never quietly: its
//     request claims the count and waits for Redis's answer (claim.go),
//     or, where it may not wait, is told to the others at once (published
//     through Redis) so that they see it before their next request. A
//     quiet share of the pool's room, reckoned at each replica's last word
//     from Redis, was taken again by the others' claims before they saw
//     it (22 of a burst of 20 for 100 calls in 100 ms over 3 replicas, a
//     key past its first two intervals, no fault). A guarantee is given only where the replica's demand fills
//     it (demand at least 1.1 times the guarantee, twice it for one
//     request): a share of a request or two on a replica that sees a
//     request now and then would sit idle while the others refuse, so it
//     stays in the pool, where the first replica with a request takes it;
//     and none is given where θ/N holds no whole request (guarantee).

// shareUnit is a request's counts (rate.Unit): guarantees are whole
// requests.
const shareUnit = 2

// shareFill: a guarantee is given where demand is at least this times
// it; a guarantee of one request needs twice it (two requests a tick: a
// replica that sees one a tick would often leave it idle for a tick).
const shareFillNum, shareFillDen = 11, 10

// peerShare is one replica's state of one hot key as Redis holds it, its
// counts decayed to the reply's tick.
type peerShare struct {
	id      string
	c, d, g uint32
	ts      int64 // when its replica signed it (fleet.peersOf)
}

// shareView is what this replica knows of one hot key's fleet: built from
// a reply to its own round, or from another replica's published claim.
// Immutable once built.
type shareView struct {
	tick   int64 // the tick its counts are at
	at     int64 // Redis's time of it (µs): a later view replaces an earlier
	others []peerShare
	meC    uint32 // this replica's count as Redis holds it
	g      uint32 // this replica's guarantee, as it may use it
	sumGo  uint32 // the other replicas' guarantees as Redis holds them
	// suspect: a record read less than it can (keepPeers), so what a
	// replica counted since that view is unknown: the key is decided at
	// the stricter of this view and θ/N until a view is not.
	suspect bool
	// reserve is room held for replicas that have not yet joined a key
	// that was just shared (they may hold up to the promotion point
	// each), virtual how many they are; n is how many replicas the pool
	// is split among. young: the key was shared less than two intervals
	// ago (allowance).
	reserve, n, virtual uint32
	young               bool
	// forged: the reply held a record that did not verify (made up, or
	// of a replica before signed records), which shareScript counts
	// when it decides a conditional claim and this view does not.
	forged bool
}

func halve(v uint32, ticks int64) uint32 {
	switch {
	case ticks <= 0:
		return v
	case ticks >= 32:
		return 0
	}
	return v >> ticks
}

// overBy is how far count c is past guarantee g, in whole requests' counts.
func overBy(c, g uint32) int64 {
	if c <= g {
		return 0
	}
	return int64(c-g+1) &^ 1
}

// allowance is what this replica may count of the key at tick now: top,
// the most its count may reach, and quiet, the most it may reach without
// a word to the other replicas: its guarantee, and what Redis holds of its
// count past it already. theta is the key's threshold.
func (v *shareView) allowance(theta uint32, now int64) (top, quiet uint32) {
	age := now - v.tick
	th, reserve := int64(theta), int64(v.reserve)
	pool := max(0, th-int64(v.g)-int64(v.sumGo)-reserve)
	// While the key is young, each replica not yet joined may count its
	// share of the pool before its word reaches this one (requests that
	// may not wait for a claim decide first and tell after): it is held
	// at that share, beyond the reserve held for it. Replicas that have joined are not
	// held at theirs: that stopped a burst at a key's birth (24 of 20 for
	// 100 calls in 100 ms over 3 replicas, TestFleetProcessBurst, 20
	// with it) but refused a client under its limit (1 of 16,
	// TestFleetRedisHostile), the wrong direction.
	unseen := pool / int64(max(1, v.n)) &^ 1
	var over, held, others int64
	for _, p := range v.others {
		c := int64(halve(p.c, age))
		others += c
		over += overBy(uint32(min(c, math.MaxUint32)), p.g)
		held += max(c, int64(p.g))
	}
	if v.virtual > 0 {
		extra := int64(v.virtual) * max(0, unseen-reserve/int64(v.virtual))
		others, over, held = others+extra, over+extra, held+extra
	}
	// A guarantee never counts on room another replica still holds (a
	// share that moved, a count over its guarantee): it waits for those
	// counts to halve.
	g := int64(v.g)
	if lim := th - reserve - held; g > lim {
		g = max(0, lim) &^ 1
	}
	mine := overBy(halve(v.meC, age), v.g) // what Redis knows this replica took
	q := g + mine
	t := min(int64(v.g)+max(0, pool-over), max(g, th-reserve-held), th-others)
	t = max(0, t)
	return uint32(t), uint32(min(q, t))
}

// sharePoint is the local count past which a key joins the hot set: a
// fraction of its fair share θ/N, so that it is shared before it can take
// that share; 0 where the fair share holds no whole request (θ < 2N
// counts): then every key is shared from its first request, since a
// replica that decided one alone would either refuse it (and the client's
// whole burst) or admit it on every replica (N times the burst).
func sharePoint(theta uint32, n int64, fraction float64) uint32 {
	if fairShare(theta, n) < shareUnit {
		return 0
	}
	return max(shareUnit, uint32(fraction*float64(theta)/float64(n)))
}

// fairShare is θ/N in whole requests' counts.
func fairShare(theta uint32, n int64) uint32 {
	return uint32(int64(theta)/max(1, n)) &^ 1
}

// shareOrder is the order in which replicas whose claims are equal take
// the remainders of the apportionment: the same on every replica, and
// different for each key, so that the remainders spread.
func shareOrder(rkey, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(rkey))
	h.Write([]byte{0})
	h.Write([]byte(id))
	return h.Sum64()
}

// guarantee is replica me's guarantee of a key of threshold theta among
// peers (me included), N replicas in all. During the key's first rounds
// (young), replicas not yet present count as present with the average
// demand, and each holds point (what it may count before it joins) in
// reserve. It also returns the reserve and the number of replicas the pool
// is split among. Where θ/N holds no whole request there is none: the
// limit is a request or two, all pool, and each request past what Redis
// holds claims it (fleet.go, pastQuiet). One replica holding the whole
// limit as its guarantee refused the others' claims until it moved
// (0.85 of one replica alone at 10x in the first 10 s on the sim).
func guarantee(me string, peers []peerShare, n int, young bool, theta, point uint32, rkey string) (g, reserve, split uint32) {
	cs, total, reserve := shareClaims(me, peers, n, young, point, rkey)
	apportion(cs, total, theta)
	var mine, others int64
	for _, c := range cs {
		switch {
		case c.virtual:
		case c.mine:
			// Only what the demand fills: the rest stays in the pool.
			fills := int64(c.rawD) * shareFillDen / (shareFillNum * shareUnit)
			if fills == 1 && c.rawD < 2*2*shareUnit {
				fills = 0
			}
			mine = shareUnit * min(c.units, fills)
		default:
			others += int64(c.stored)
		}
	}
	if lim := int64(theta) - others - int64(reserve); mine > lim {
		mine = max(0, lim) &^ 1
	}
	if fairShare(theta, int64(n)) < shareUnit {
		mine = 0
	}
	return uint32(mine), reserve, uint32(max(len(cs), n))
}

// shareClaim is one replica's claim in the apportionment of a key's
// threshold (guarantee).
type shareClaim struct {
	d       float64 // demand
	units   int64
	rank    int // the remainder's eighths, plus four for its holder
	order   uint64
	virtual bool // a replica not yet present
	mine    bool
	rawD    uint32
	stored  uint32 // its guarantee as Redis holds it
}

// shareClaims are the claims of peers, and of the replicas not yet present
// while the key is young (each holding point in reserve), with their
// demands' total (each demand 1 where all are 0).
func shareClaims(me string, peers []peerShare, n int, young bool, point uint32, rkey string) (cs []shareClaim, total float64, reserve uint32) {
	cs = make([]shareClaim, 0, max(len(peers), n))
	for _, p := range peers {
		cs = append(cs, shareClaim{d: float64(p.d), order: shareOrder(rkey, p.id), mine: p.id == me, rawD: p.d, stored: p.g})
		total += float64(p.d)
	}
	present := presentWith(peers, me)
	if young && present < n {
		avg := 1.0
		if len(peers) > 0 && total > 0 {
			avg = total / float64(len(peers))
		}
		for range n - present {
			cs = append(cs, shareClaim{d: avg, virtual: true, order: math.MaxUint64})
			total += avg
			reserve += point
		}
	}
	if total == 0 {
		for i := range cs {
			cs[i].d = 1
		}
		total = float64(len(cs))
	}
	return cs, total, reserve
}

// presentWith is how many replicas peers (a key's records) and me make:
// me is present whether or not Redis holds its record yet. A view of a
// claim heard just after the records were flushed names only the
// replicas that wrote since, and room held for me as a replica not yet
// present (a reserve, a share of the pool) refused me a client under its
// limit's room (0.85x keys, TestFleetSimHostileRedis, with claims past
// the guarantee; TestViewVirtualNotMe).
func presentWith(peers []peerShare, me string) int {
	if slices.ContainsFunc(peers, func(p peerShare) bool { return p.id == me }) {
		return len(peers)
	}
	return len(peers) + 1
}

// apportion gives each claim its units of theta's whole requests in
// proportion to its demand (of total), by largest remainders.
func apportion(cs []shareClaim, total float64, theta uint32) {
	units := int64(theta / shareUnit)
	left := units
	for i := range cs {
		s := float64(units) * cs[i].d / total
		f := int64(s)
		cs[i].units = f
		cs[i].rank = int((s - float64(f)) * 8)
		if !cs[i].virtual && int64(cs[i].stored/shareUnit) > f {
			// It holds a remainder's request now: it keeps it unless
			// another's claim is larger by half a request. Demands jitter
			// from round to round (a few requests a tick); a remainder
			// that moved at each round would sit unused while it moves.
			cs[i].rank += 4
		}
		left -= f
	}
	idx := make([]int, len(cs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		x, y := &cs[a], &cs[b]
		switch {
		case x.rank != y.rank:
			return y.rank - x.rank
		case x.order < y.order:
			return -1
		case x.order > y.order:
			return 1
		}
		return 0
	})
	for i := 0; int64(i) < left && i < len(idx); i++ {
		cs[idx[i]].units++
	}
}

// keepPeers returns peers (a reply's records, this replica's among them)
// with what prev (the view the reply replaces) knew of the others where
// the reply says less: a replica's count of a key only halves, once a
// tick, and a record Redis drops for its age keeps its count (shareScript),
// so a record that reads lower than prev's count halved to tick, or is
// missing while that count is not spent, was rewritten, deleted or
// flushed by someone else, or lost with Redis. Such a record is what prev
// knew of it, halved: its count, its demand and its guarantee, since the
// replica may still count within that guarantee without a word. kept
// reports one missing, or lower than a tick more of halving allows (the
// view built on it is suspect): a replica whose clock is a few ms ahead
// of Redis's halves its count before Redis's tick ends, and that is no
// fault. nil prev, or one later than tick, changes nothing.
func keepPeers(peers []peerShare, prev *shareView, tick int64) (_ []peerShare, kept bool) {
	if prev == nil || prev.tick > tick {
		return peers, false
	}
	age := tick - prev.tick
	var out []peerShare
	for _, p := range prev.others {
		c := halve(p.c, age)
		if c == 0 {
			continue
		}
		i := slices.IndexFunc(peers, func(o peerShare) bool { return o.id == p.id })
		// A demand halves slower still (fleet.go, demand): one that fell
		// by more than two halvings past its age was rewritten too.
		forged := i < 0 || peers[i].c < halve(p.c, age+1) || peers[i].d < halve(p.d, age+2)
		if i >= 0 && peers[i].c >= c && !forged {
			continue
		}
		if out == nil {
			out = slices.Clone(peers)
		}
		k := peerShare{id: p.id, c: c, d: halve(p.d, age-1), g: p.g, ts: p.ts}
		kept = kept || forged
		if i < 0 {
			out = append(out, k)
			continue
		}
		out[i] = peerShare{id: p.id, c: max(out[i].c, c), d: max(out[i].d, k.d), g: max(out[i].g, k.g), ts: max(out[i].ts, k.ts)}
	}
	if out == nil {
		return peers, false
	}
	return out, kept
}

// othersApportioned returns peers with each other replica's guarantee at
// least what the apportionment of these records gives it: a stored
// guarantee is only what its replica wrote, and one rewritten lower (its
// count and demand kept, which keepPeers would catch) would hand its room
// to the reader while its replica still counts within it. me's is left
// as stored.
func othersApportioned(me string, peers []peerShare, n int, young bool, theta, point uint32, rkey string) []peerShare {
	var out []peerShare
	for i, p := range peers {
		if p.id == me {
			continue
		}
		gp, _, _ := guarantee(p.id, peers, n, young, theta, point, rkey)
		if gp <= p.g {
			continue
		}
		if out == nil {
			out = slices.Clone(peers)
		}
		out[i].g = gp
	}
	if out == nil {
		return peers
	}
	return out
}
