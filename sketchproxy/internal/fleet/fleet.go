package sketchproxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// fleet is the shared state of one Middleware's replica: the hot set, each
// hot key's share (fleetshare.go), and the goroutines that sync them with
// Redis (fleetredis.go).
type fleet struct {
	cfg    *FleetConfig
	secret []byte // keys are HMACed with it before they reach Redis
	store  fleetStore
	log    *slog.Logger
	now    func() time.Time

	n       atomic.Int64 // replicas, at least 1
	up      atomic.Bool
	hearing atomic.Bool // subscribed to the claims channel

	// self names this fleet's records and heartbeat in Redis: the
	// configured id, with a suffix of its own where newFleet starts it
	// (fleetSelf), so that no other fleet, in this process or after a
	// restart, ever writes its record.
	self string
	// seen is the most replicas the heartbeat counted lately (in this
	// window of stale(), from seenAt, f.now ns, and the one before:
	// seenCur and seenPrev), or a state file kept (RestoreMembers): N
	// while Redis is unreachable, and N's floor while it answers, so that
	// a members' set flushed or rewritten does not make a replica count
	// itself alone. A replica that left stops counting within two
	// windows, as its records lapse within one. seenMu orders their
	// writers (the sync goroutine and a restore) and guards peak, the
	// most seen within fleetPeakKept, and peakAt, when it was last seen
	// (f.now ns): what the state file keeps (fleetmembers.go).
	seen, seenAt, seenCur, seenPrev atomic.Int64
	seenMu                          sync.Mutex
	peak, peakAt                    int64
	sizeWarned                      atomic.Bool
	// warmUntil ends the warm-up that follows this replica's first answer
	// from Redis (f.now ns): until then a key joins the hot set at its
	// third request (fleetWarmPoint).
	warmUntil atomic.Int64

	shards [16]hotShard
	count  atomic.Int64

	// rkeys finds a hot entry by its name in Redis, for the claims other
	// replicas publish; heard keeps the latest claim on keys not hot here
	// (at most heardMax), for the moment one becomes hot.
	rmu   sync.Mutex
	rkeys map[string]*hotEntry
	heard map[string]shareReply

	// pend are the entries to send at once (a claim, a promotion); kick
	// wakes the sync goroutine for them.
	pmu  sync.Mutex
	pend []*hotEntry
	kick chan struct{}

	rounds, roundErrors, keySyncs, commands atomic.Uint64
	promotions, demotions, hotFull, resends atomic.Uint64
	claims, claimsHeard, rejected           atomic.Uint64
	rttNs, lastOK, rejectLogged             atomic.Int64
	// redisAt is the latest Redis time (µs) a reply to this replica
	// carried; redisSeen, f.now (ns) when it came.
	redisAt, redisSeen atomic.Int64
	roundTime          prometheus.Histogram

	run   map[string]string // each hash tag's run marker as last seen, by marker key (sync goroutine only)
	runID string            // this replica's candidate marker

	// recKey keys the records' MACs (sign), derived from the secret
	// apart from the keys' hashes; macs pools its HMACs. lastTS is the
	// time the last send signed (sync goroutine only).
	recKey []byte
	macs   sync.Pool
	lastTS int64

	stop    chan struct{}
	done    chan struct{}
	first   chan struct{} // closed once the first round has ended
	started bool
}

// heardMax bounds the claims kept for keys not hot here.
const heardMax = 4096

type hotShard struct {
	mu sync.Mutex
	m  map[string]*hotEntry
}

// hotEntry is one promoted key of one limit or budget.
type hotEntry struct {
	rkey   string // prefix + {tag} + HMAC(secret, sketch key)
	marker string // prefix + {tag} + run: the tag's run marker, in the same slot
	skey   []byte // the local sketch key
	sk     engine.Local
	tick   time.Duration
	theta  uint32

	demand  demand
	view    atomic.Pointer[shareView]
	pending atomic.Bool // queued to be sent at once
	// unsynced: Redis answered the last round, but not with this key's
	// records (a key of another type under the prefix): decided alone at
	// its fair share until a round syncs it.
	unsynced atomic.Bool
	loud     atomic.Bool // the next send publishes: a claim on the pool

	// gWant is the guarantee to store at the next send; gSent, the one
	// the last send stored (sync goroutine only).
	gWant, gSent uint32
	// since is when it was promoted (f.now ns).
	since int64
}

// newFleet returns a fleet on Redis; start runs it.
func newFleet(cfg *FleetConfig, fb *config.FleetBuilt, log *slog.Logger, now func() time.Time) *fleet {
	f := newFleetOn(cfg, fb.Secret(), newRedisStore(fb.RedisOptions()), log, now)
	f.self = fleetSelf(cfg.ID)
	return f
}

// newFleetOn returns a fleet on store whose goroutines have not started:
// tests of the arithmetic drive its rounds themselves (fleet_sim_test.go).
func newFleetOn(cfg *FleetConfig, secret []byte, store fleetStore, log *slog.Logger, now func() time.Time) *fleet {
	f := &fleet{
		cfg: cfg, log: log, now: now, store: store, secret: secret,
		runID: cfg.ID, self: cfg.ID,
		run:   map[string]string{},
		rkeys: map[string]*hotEntry{},
		heard: map[string]shareReply{},
		kick:  make(chan struct{}, 1),
		roundTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sketchproxy_fleet_round_duration_seconds",
			Help:    "Time of each sync round with Redis (one pipeline per node), failed rounds included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 0.1 ms to 0.8 s
		}),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		first: make(chan struct{}),
	}
	for i := range f.shards {
		f.shards[i].m = map[string]*hotEntry{}
	}
	f.n.Store(int64(max(1, cfg.Replicas)))
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("sketchproxy fleet records"))
	f.recKey = m.Sum(nil)
	f.macs.New = func() any { return hmac.New(sha256.New, f.recKey) }
	return f
}

// start runs the fleet's sync and returns once its first round has ended
// (a round's timeout at most, twice for a slow dial): a replica then
// decides its first request knowing whether Redis answers and how many
// replicas it counts, not with the N it assumes without them.
func (f *fleet) start() {
	f.started = true
	go f.loop()
	var warned atomic.Bool
	go f.store.listen(f.channel(), f.hear, func() {
		f.commands.Add(1) // SUBSCRIBE
		f.hearing.Store(true)
		warned.Store(false)
	}, func(err error) {
		f.hearing.Store(false)
		select {
		case <-f.stop:
			return // closing: the subscription ends with the client
		default:
		}
		if !warned.Swap(true) {
			// Rounds go on; a claim is heard at the claimer's next round
			// instead of at once (an ACL without SUBSCRIBE or the channel).
			f.log.Warn("fleet: not hearing the other replicas' claims: they reach this replica at its next round", "channel", f.channel(), "err", err.Error())
		}
	})
	t := time.NewTimer(2 * time.Duration(f.cfg.Timeout))
	defer t.Stop()
	select {
	case <-f.first:
	case <-t.C:
	}
}

func (f *fleet) close() {
	close(f.stop)
	if f.started {
		<-f.done
	}
	f.store.close()
}

// channel is where replicas publish their claims on a pool.
func (f *fleet) channel() string { return f.cfg.Prefix + "claims" }

func (f *fleet) shard(k []byte) *hotShard {
	var h uint32 = 2166136261
	for _, c := range k {
		h = (h ^ uint32(c)) * 16777619
	}
	return &f.shards[h%uint32(len(f.shards))]
}

// replicas is N: replicas if set, else the replicas that heartbeat now
// or lately (seen). While Redis is unreachable it is the most seen
// lately or kept in the state file, at least min_replicas; before any
// was seen, min_replicas or fleetUnknownReplicas: a replica that cannot
// tell how many others run assumes more, not fewer (docs/fleets.md, How
// a replica counts its peers).
func (f *fleet) replicas() int64 {
	if f.cfg.Replicas > 0 {
		return int64(f.cfg.Replicas)
	}
	seen := f.seen.Load()
	if f.up.Load() {
		return max(1, f.n.Load(), seen)
	}
	n := max(seen, int64(f.cfg.MinReplicas))
	if n == 0 {
		return fleetUnknownReplicas
	}
	return n
}

// fleetUnknownReplicas is N while Redis is unreachable and no replicas,
// min_replicas, heartbeat or state file says more: 2, not more, since a
// replica alone (or one of 2) at θ/3 would refuse a client a third of its
// limit; a fleet that gives none of them is warned (FleetSizeWarning,
// warnSizeUnknown).
const fleetUnknownReplicas = 2

// fleetSelf is id with a suffix of its own (8 random hex digits).
func fleetSelf(id string) string {
	var b [4]byte
	rand.Read(b[:])
	return id + "." + hex.EncodeToString(b[:])
}

// noteMembers records that the heartbeat counted card replicas now, and
// that a hot key's records named peers replicas (sync goroutine only):
// seen, N's floor, is the most of either lately, as a members' set
// flushed every moment counts few.
func (f *fleet) noteMembers(card, peers int64) {
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	now := f.now().UnixNano()
	card = max(1, card)
	f.notePeak(max(card, peers), now)
	if now-f.seenAt.Load() > int64(f.stale()) {
		f.seenPrev.Store(f.seenCur.Load())
		f.seenCur.Store(0)
		f.seenAt.Store(now)
	}
	f.seenCur.Store(max(f.seenCur.Load(), card, peers))
	f.seen.Store(max(f.seenCur.Load(), f.seenPrev.Load()))
	f.n.Store(card)
}

// Estimate is what the engine decides k against (engine.Fleet): the local
// count, plus the part of θ this replica may not use. A hot key's part is
// θ less its allowance (fleetshare.go); a key below its promotion point
// is decided alone, as it cannot hold more than that point; while Redis is
// down every key is decided at θ/N (the local count × N). Mice below a
// quarter of the promotion point cost one comparison: no map, no Redis.
// A request that adds to a key on its first sight past the point promotes
// it, and the key is sent to Redis at once: shared before it can pass its
// fair share.
func (f *fleet) Estimate(skey []byte, sk engine.Local, tick time.Duration, theta, local, add uint32, now time.Time) (uint32, bool) {
	n := f.replicas()
	if !f.up.Load() {
		// Its fair share, the request included: the local count × N
		// against θ let each replica count a request past θ/N. Nor
		// more than the room the others left at the last word from
		// Redis: a replica whose count was under θ/N while another's
		// was over it would otherwise add to a key already at θ.
		return max(alone(local, theta, n), f.othersKnown(skey, sk, tick, theta, local, now)), false
	}
	p := sharePoint(theta, n, f.cfg.PromoteFraction)
	if now.UnixNano() < f.warmUntil.Load() {
		p = min(p, fleetWarmPoint)
	}
	below := uint64(local)+uint64(add) <= uint64(p)
	if below && local < p/4 {
		return local, false
	}
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	if e != nil && (e.sk != sk || e.tick != tick || e.theta != theta) {
		// A reload changed the limit (another tick, threshold or sketch)
		// under the same rule and limit names: the entry shares another
		// limit's count, so it goes, and the key is shared anew under a
		// record of its own (redisKeys hashes the tick and threshold).
		f.drop(s, e)
		e = nil
	}
	if e == nil {
		if below || add == 0 {
			s.mu.Unlock()
			return local, false
		}
		if f.count.Load() >= int64(f.cfg.MaxHot) {
			s.mu.Unlock()
			f.hotFull.Add(1)
			return alone(local, theta, n), false
		}
		e = &hotEntry{skey: append([]byte(nil), skey...), sk: sk, tick: tick, theta: theta, since: now.UnixNano()}
		e.rkey, e.marker = f.redisKeys(skey, tick, theta)
		e.demand.start(uint32(min(uint64(local)+uint64(add), math.MaxUint32)), now.UnixNano()/int64(tick))
		s.m[string(e.skey)] = e
		f.count.Add(1)
		f.promotions.Add(1)
		s.mu.Unlock()
		f.rmu.Lock()
		f.rkeys[e.rkey] = e
		r, ok := f.heard[e.rkey]
		delete(f.heard, e.rkey)
		f.rmu.Unlock()
		if ok && tickFits(e, &r) {
			// Another replica claimed this key lately: start from its word.
			v, _ := f.viewOf(e, &r, 0, nil)
			e.view.Store(v)
		}
		f.sendSoon(e, false)
	} else {
		s.mu.Unlock()
		if add > 0 {
			e.demand.add(add, now.UnixNano()/int64(tick))
		}
	}
	if e.unsynced.Load() {
		return alone(local, theta, n), false
	}
	v := e.view.Load()
	if v == nil {
		// Promoted, not yet answered (a round trip): its fair share, or a
		// request where that holds none; what it counts is published.
		return alone(local, theta, n), true
	}
	top, quiet := v.allowance(theta, now.UnixNano()/int64(tick))
	est := uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
	if v.suspect {
		est = max(est, alone(local, theta, n))
	}
	return est, uint64(local)+uint64(add) > uint64(quiet)
}

// alone is the estimate of a key this replica decides by itself at its
// fair share θ/N (at least one request).
func alone(local, theta uint32, n int64) uint32 {
	top := max(fairShare(theta, n), shareUnit)
	return uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
}

// Counted is told that a request Estimate asked about counted in k: a
// claim on the pool (or a count while the key awaits its first answer),
// which the other replicas must see before their next request. It is sent
// and published at once.
func (f *fleet) Counted(skey []byte) {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e != nil {
		f.sendSoon(e, true)
	}
}

// sendSoon queues e to be sent at once; loud, with its claim published.
func (f *fleet) sendSoon(e *hotEntry, loud bool) {
	if loud {
		e.loud.Store(true)
	}
	if e.pending.Swap(true) {
		return
	}
	f.pmu.Lock()
	f.pend = append(f.pend, e)
	f.pmu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// WalletsClosed reports whether wallets fail closed now: Redis is down and
// wallet_on_failure is closed. A refused client retries after a round.
func (f *fleet) WalletsClosed() (bool, time.Duration) {
	return !f.up.Load() && f.cfg.WalletOnFailure == "closed", time.Duration(f.cfg.Interval)
}

// demand counts the requests a replica sees of a hot key (admitted or
// not, in counts), halving with the key; it reports the count as of the
// start of the current tick, doubled (what the halving count reads at the
// end of a steady tick). A count read mid-tick would rise through each
// tick: replicas that write at different moments would report demands up
// to twice apart for one round-robin client, and their shares would
// follow that noise.
type demand struct {
	mu         sync.Mutex
	tick       int64
	base, part uint32 // the count at the start of tick; added since
}

func (d *demand) start(c uint32, tick int64) {
	d.mu.Lock()
	d.tick, d.base, d.part = tick, c/2, 0
	d.mu.Unlock()
}

// roll moves d to tick tk (d.mu held).
func (d *demand) roll(tk int64) {
	if tk > d.tick {
		d.base = halve(uint32(min(uint64(d.base)+uint64(d.part), math.MaxUint32)), tk-d.tick)
		d.tick, d.part = tk, 0
	}
}

func (d *demand) add(n uint32, tk int64) {
	d.mu.Lock()
	d.roll(tk)
	d.part = uint32(min(uint64(d.part)+uint64(n), math.MaxUint32))
	d.mu.Unlock()
}

// at is the demand to report at tick tk.
func (d *demand) at(tk int64) uint32 {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.roll(tk)
	return uint32(min(2*uint64(d.base), math.MaxUint32))
}

func (e *hotEntry) demandAt(now time.Time) uint32 {
	return e.demand.at(now.UnixNano() / int64(e.tick))
}

// fleetTags is how many hash tags spread the hot keys over a Redis
// Cluster's nodes; each tag's keys and run marker share a slot.
const fleetTags = 16

// redisKeys are the key's name in Redis, the keyed hash of the sketch key
// and of its limit's tick and threshold (Redis never sees a client address
// or an API key, and a limit changed at a reload counts apart from the
// old one's record), and the run marker of its hash tag.
func (f *fleet) redisKeys(skey []byte, tick time.Duration, theta uint32) (key, marker string) {
	m := hmac.New(sha256.New, f.secret)
	m.Write(skey)
	var lim [12]byte
	binary.LittleEndian.PutUint64(lim[:8], uint64(tick))
	binary.LittleEndian.PutUint32(lim[8:], theta)
	m.Write(lim[:])
	sum := m.Sum(nil)
	tag := f.cfg.Prefix + "{t" + strconv.Itoa(int(sum[16])%fleetTags) + "}"
	return tag + "k:" + hex.EncodeToString(sum[:16]), tag + "run"
}

// loop syncs every interval, and at once when entries are queued (claims,
// promotions); after a failure it waits longer, up to 1 s or two
// intervals, before the next try, and recovers at the first round that
// succeeds. The cap is short because replicas that recover at different
// times see each other's counts late. While Redis is down, queued entries
// wait for the next round.
func (f *fleet) loop() {
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
func (f *fleet) round() bool {
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
func (f *fleet) sendPending() {
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

// send sends es (with beat, the heartbeat too) and applies the replies.
func (f *fleet) send(es []*hotEntry, beat bool) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(f.cfg.Timeout))
	defer cancel()
	start := time.Now()
	now := f.now()
	interval := time.Duration(f.cfg.Interval)
	r := &shareRound{
		id: f.self, candidate: fmt.Sprintf("%s-%d", f.runID, time.Now().UnixNano()), channel: f.channel(),
		stale: f.stale(), ttl: 2 * interval,
	}
	calls := make([]shareCall, len(es))
	for i, e := range es {
		calls[i] = shareCall{rkey: e.rkey, marker: e.marker, tick: e.tick,
			c: e.sk.EstimateBytes(e.skey), d: e.demandAt(now), g: e.gWant,
			at: now.UnixNano() / int64(e.tick), publish: e.loud.Swap(false)}
		if calls[i].publish {
			f.claims.Add(1)
		}
	}
	f.sign(calls)
	var hb *heartbeat
	if beat && f.cfg.Replicas == 0 {
		hb = &heartbeat{key: f.cfg.Prefix + "members", id: f.self, now: now, window: 3*interval + time.Second}
	}
	replies, card, sent, err := f.store.sync(ctx, r, calls, hb)
	f.commands.Add(uint64(sent))
	f.rounds.Add(1)
	f.roundTime.Observe(time.Since(start).Seconds())
	// Keys whose node answered are synced even when another node did not
	// (Redis Cluster). A tag whose marker changed lost its records (with
	// Redis Cluster, one node can): every replica writes its record whole
	// at each round, so nothing is resent; until all have, the key's
	// first rounds hold room for the missing ones (guarantee).
	lost := 0
	synced := 0
	var peers int64
	for i, e := range es {
		rp := &replies[i]
		if !rp.ok {
			if err == nil && !e.unsynced.Swap(true) {
				f.log.Warn("fleet: Redis answered, but not with a hot key's records (a key of another type under the prefix?): the key is decided here at its fair share until it syncs", "key", e.rkey)
			}
			continue
		}
		e.unsynced.Store(false)
		if old, seen := f.run[e.marker]; seen && old != rp.run {
			lost++
		}
		f.run[e.marker] = rp.run
		synced++
		if rp.now > f.redisAt.Load() {
			f.redisSeen.Store(f.now().UnixNano())
			f.redisAt.Store(rp.now)
		}
		e.gSent = calls[i].g
		v, g := f.viewOf(e, rp, e.gSent, nil)
		peers = max(peers, int64(len(rp.peers)))
		f.store1(e, v)
		e.gWant = g // stored at the next round: until then the pool holds its room
	}
	if lost > 0 {
		f.resends.Add(1)
		f.log.Warn("fleet: Redis lost the shared counts (restarted empty): every replica writes its own again", "keys", lost)
	}
	f.keySyncs.Add(uint64(synced))
	if err != nil {
		f.roundErrors.Add(1)
		if f.up.Swap(false) || f.lastOK.Load() == 0 {
			f.log.Warn("fleet: Redis unreachable: enforcing limits locally at 1/N", "err", err.Error(), "replicas", f.replicas())
			f.warnSizeUnknown()
		}
		return false
	}
	f.warmUntil.CompareAndSwap(0, f.now().UnixNano()+int64(f.stale()))
	f.rttNs.Store(int64(time.Since(start)))
	f.lastOK.Store(f.now().UnixNano())
	if hb != nil {
		f.noteMembers(card, peers)
	}
	if !f.up.Swap(true) {
		f.log.Info("fleet: Redis reachable: enforcing fleet-wide limits", "replicas", f.replicas(), "hot_keys", f.count.Load())
	}
	return true
}

// stale is how long a replica's record outlives its last write: a
// replica gone (or one whose key cooled) gives its guarantee back then.
func (f *fleet) stale() time.Duration { return 4*time.Duration(f.cfg.Interval) + time.Second }

// viewOf builds e's view from a reply to this replica's send (own: gSent
// is the guarantee it stored) or from a claim heard (cur is the view it
// replaces). It returns the view and the guarantee the reply computes.
// A guarantee shrinks at once; it grows only once Redis holds it, so that
// the guarantees Redis holds always cover the ones in use.
func (f *fleet) viewOf(e *hotEntry, rp *shareReply, gSent uint32, cur *shareView) (*shareView, uint32) {
	n := f.replicas()
	prev := cur
	if prev == nil {
		prev = e.view.Load()
	}
	var suspect, kept bool
	rp.peers, suspect = f.peersOf(e.rkey, rp, prev)
	rp.peers, kept = keepPeers(rp.peers, prev, rp.tick)
	young := time.Duration(rp.now-rp.born)*time.Microsecond < 2*time.Duration(f.cfg.Interval)
	point := sharePoint(e.theta, n, f.cfg.PromoteFraction)
	rp.peers = othersApportioned(f.self, rp.peers, int(n), young, e.theta, point, e.rkey)
	g, reserve, split := guarantee(f.self, rp.peers, int(n), young, e.theta, point, e.rkey)
	// A claim carries only the records that verify: it never clears a
	// suspect view, which only a round that reads every record whole does.
	suspect = suspect || kept || rp.claim && prev != nil && prev.suspect
	v := &shareView{tick: rp.tick, at: rp.now, reserve: reserve, n: split, suspect: suspect}
	// The key is young here too (promoted lately, not a record whose
	// hash was deleted under a key long hot): the others' quiet shares
	// are held (allowance).
	v.young = young && f.now().UnixNano()-e.since < int64(2*f.cfg.Interval)
	if v.young && len(rp.peers) < int(n) {
		v.virtual = uint32(int(n) - len(rp.peers))
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
func (f *fleet) store1(e *hotEntry, v *shareView) {
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

// hear applies a claim another replica published: the key's records as
// the script read them, merged into what this replica knew of the others.
// Anyone allowed to PUBLISH on the channel can send a claim, so a claim
// is only the records in it whose MAC verifies (fleet.verify): one with
// none, or with nothing later than this replica knew, is dropped. Its
// tick and time are the latest its records signed, not its head's: an
// unsigned head dated a tick later would halve every count once more.
func (f *fleet) hear(payload string) {
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
func (f *fleet) claimTime(rkey string, rp *shareReply) bool {
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
func (f *fleet) peersOf(rkey string, rp *shareReply, prev *shareView) (_ []peerShare, suspect bool) {
	stale := int64(f.stale() / time.Microsecond)
	out := make([]peerShare, 0, len(rp.recs)+1)
	rejected := 0
	for _, r := range rp.recs {
		own := r.id == f.self && !rp.claim
		if !own && !rp.verified && !f.verify(rkey, &r) {
			rejected++
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
func (f *fleet) sign(calls []shareCall) {
	ts := f.now().UnixMicro()
	if at := f.redisAt.Load(); at != 0 {
		ts = at + max(0, f.now().UnixNano()-f.redisSeen.Load())/int64(time.Microsecond)
	}
	f.lastTS = max(ts, f.lastTS+1)
	for i := range calls {
		c := &calls[i]
		c.ts = f.lastTS
		c.mac = f.macOf(c.rkey, &signedRec{id: f.self, c: c.c, d: c.d, g: c.g, at: c.at, ts: c.ts})
	}
}

// recMACSize is a record's MAC, truncated HMAC-SHA256 (bytes).
const recMACSize = 16

// macOf is the MAC of record r of key rkey, in hex.
func (f *fleet) macOf(rkey string, r *signedRec) string {
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
func (f *fleet) verify(rkey string, r *signedRec) bool {
	return !r.unsigned && hmac.Equal([]byte(f.macOf(rkey, r)), []byte(r.mac))
}

// reject counts n records not believed, and says so in the log at most
// once a minute.
func (f *fleet) reject(n int) {
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
func (f *fleet) plausible(rp shareReply) bool {
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

// demote drops hot keys that cooled here and fleet-wide: the local count
// and the demand below a quarter of the promotion point, nothing counted
// elsewhere above it, and nothing left to send. Redis drops the key's
// record once it halves to nothing.
func (f *fleet) demote(es []*hotEntry) {
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
func (f *fleet) drop(s *hotShard, e *hotEntry) {
	delete(s.m, string(e.skey))
	f.count.Add(-1)
	f.demotions.Add(1)
	f.rmu.Lock()
	delete(f.rkeys, e.rkey)
	f.rmu.Unlock()
}
