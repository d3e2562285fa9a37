package fleet

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/prometheus/client_golang/prometheus"
)

// Fleet is the shared state of one replica (a Middleware's, a Limiter's,
// or a Caddy fleet's engine): the hot set, each hot key's share (share.go),
// and the goroutines that sync them with Redis (sync.go, redis.go). It is
// the engine's engine.Fleet and engine.FleetMembers, and a
// prometheus.Collector of its metrics (metrics.go). Make one with New or
// Open; its methods are safe for concurrent use.
type Fleet struct {
	cfg    *config.FleetConfig
	secret []byte // keys are HMACed with it before they reach Redis
	store  fleetStore
	log    *slog.Logger
	now    func() time.Time
	// skew is how far this replica's clock is off Redis's (ns, Redis's
	// less its own), as far as replies have shown it (noteSkew); warned
	// past clockSkewWarn, again only once it fell under half that.
	skew       atomic.Int64
	skewWarned atomic.Bool

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
	// (f.now ns): what the state file keeps (members.go).
	seen, seenAt, seenCur, seenPrev atomic.Int64
	seenMu                          sync.Mutex
	peak, peakAt                    int64
	sizeWarned                      atomic.Bool
	// beatBroken: the last round's heartbeat had no answer (warned once).
	beatBroken atomic.Bool
	// beats counts the heartbeats Redis answered: until the second, N is
	// at least min_replicas and UnknownReplicas (replicas).
	beats atomic.Int64
	// warmUntil ends the warm-up (f.now ns): from this replica's first
	// answer from Redis (idleWarm until then) to stale() past its first
	// request decided while Redis answers, so that a replica whose
	// traffic comes late (a readiness delay, a balancer's slow start)
	// is in it when it does. Until then a key joins the hot set at its
	// third request (fleetWarmPoint), and at its first where its bit is
	// set in heavyBits, the index of heavy keys read at the warm-up's
	// rounds (index.go; every stale() while idle), indexReadAt when.
	warmUntil   atomic.Int64
	heavyBits   atomic.Pointer[[]byte]
	indexReadAt atomic.Int64
	keyMacs     sync.Pool // of *macScratch (keySum)
	// indexRefused is the generation of the index Redis last refused,
	// plus one (0: none), indexWarned whether that was warned (index.go).
	indexRefused atomic.Int64
	indexWarned  atomic.Bool
	// outageAt is when this replica last saw Redis not answer (f.now
	// ns): a round that failed, a claim's send that waited half the
	// timeout or more and failed, or a send Redis ran half the timeout or
	// more after it was sent (stalled); recoveredAt, when a send was
	// answered after it (recovering).
	outageAt, recoveredAt atomic.Int64
	// recoveredTS is recoveredAt by Redis's clock (µs, redisClock); and
	// beatSeen, the other replicas the last heartbeat counted: once every
	// other replica has beaten since this one recovered, each has written
	// its records whole since (recovering).
	recoveredTS atomic.Int64
	beatSeen    atomic.Pointer[beatSeen]
	// beatsHeard is the latest signed time (Redis's µs) of each other
	// replica's heartbeat heard on the members' channel (at most
	// beatsHeldMax), beside the members' hash at the next count
	// (countMembers); bmu guards it.
	bmu        sync.Mutex
	beatsHeard map[string]heardBeat

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

	// sending orders the sends (a semaphore of one, which a claim waits
	// for only until its deadline): the sync goroutine's and the claims
	// requests wait for (claim.go). Its holder alone reads and writes what
	// a send does of the entries (gWant, gSent, own) and of the fleet
	// (run, lastTS, warnedNeverUp).
	sending chan struct{}
	// cq is the batch of claims waiting for a send (claim.go), cqMu its
	// guard; ids names the hot entries.
	cqMu sync.Mutex
	cq   *claimBatch
	ids  atomic.Uint32
	// batches and batched count the claims' sends and the entries they
	// carried.
	batches, batched atomic.Uint64

	rounds, roundErrors, keySyncs, commands atomic.Uint64
	promotions, demotions, hotFull, resends atomic.Uint64
	claims, claimsHeard, rejected, lates    atomic.Uint64
	rttNs, lastOK, rejectLogged             atomic.Int64
	// redisAt is the latest Redis time (µs) a reply to this replica
	// carried; redisSeen, f.now (ns) when it came.
	redisAt, redisSeen atomic.Int64
	roundTime          prometheus.Histogram

	run map[string]string // each hash tag's run marker as last seen, by marker key (sending)
	// restoredAt is when each tag's records were last written back after
	// Redis lost them (restoreLost; f.now ns, sending).
	restoredAt map[string]int64
	runID      string // this replica's candidate marker

	// recKey keys the records' MACs (sign), derived from the secret
	// apart from the keys' hashes; macs pools its HMACs. lastTS is the
	// time the last send signed (sending).
	recKey []byte
	macs   sync.Pool
	lastTS int64

	stop    chan struct{}
	done    chan struct{}
	first   chan struct{} // closed once the first round has ended
	started bool
	// warnedNeverUp: the warning that Redis was never reached is logged
	// (sending).
	warnedNeverUp bool
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
	bit    uint32 // its bit in the index of heavy keys (index.go)
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
	answered atomic.Bool // a reply to this replica's own send built its view

	// gWant is the guarantee to store at the next send; gSent, the one
	// the last send stored; own, the view the last reply to this
	// replica's own send built (sending).
	gWant, gSent uint32
	own          *shareView
	// since is when it was promoted (f.now ns).
	since int64

	// A young key's claims (claim.go): id names the entry in the holds
	// the engine settles; claiming orders this replica's claims on it (a
	// semaphore of one), and waiting counts the requests waiting for it.
	// cmu guards, at tick claimTk (halving): granted, the most this
	// replica's record may hold by its claims (what a send writes is
	// never less); confirmed, what a reply showed it holds; handed,
	// the counts held for requests admitted and not yet settled; and
	// claim, the count the next send claims, written only if it fits
	// (shareScript's conditional claim).
	id                 uint32
	claiming           chan struct{}
	waiting            atomic.Int32
	cmu                sync.Mutex
	granted, confirmed uint32
	claimTk            int64
	handed             uint32
	claim              uint32

	// indexGen is the generation of the index of heavy keys its bit was
	// last set in, plus one (0: none; index.go).
	indexGen atomic.Int64

	// peerRecs are the other replicas' records as the last reply to this
	// replica's own send held them, their MACs verified; restore, those
	// to write back where Redis lost them (restored). Both only under
	// f.sending.
	peerRecs, restore []signedRec
}

// New returns a fleet on Redis for cfg as config.BuildFleet (or
// config.Build) prepared it and fb, what it built; Start runs it. cfg is
// kept, not changed: a fleet's settings take a restart.
func New(cfg *config.FleetConfig, fb *config.FleetBuilt, log *slog.Logger, now func() time.Time) *Fleet {
	f := newFleetOn(cfg, fb.Secret(), newRedisStore(fb.RedisOptions()), log, now)
	f.self = fleetSelf(cfg.ID)
	return f
}

// newFleetOn returns a fleet on store whose goroutines have not started:
// tests of the arithmetic drive its rounds themselves (sim_test.go).
func newFleetOn(cfg *config.FleetConfig, secret []byte, store fleetStore, log *slog.Logger, now func() time.Time) *Fleet {
	f := &Fleet{
		cfg: cfg, log: log, now: now, store: store, secret: secret,
		runID: cfg.ID, self: cfg.ID,
		run:        map[string]string{},
		restoredAt: map[string]int64{},
		rkeys:      map[string]*hotEntry{},
		heard:      map[string]shareReply{},
		beatsHeard: map[string]heardBeat{},
		kick:       make(chan struct{}, 1),
		roundTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sketchproxy_fleet_round_duration_seconds",
			Help:    "Time of each sync round with Redis (one pipeline per node), failed rounds included.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 14), // 0.1 ms to 0.8 s
		}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		first:   make(chan struct{}),
		sending: make(chan struct{}, 1),
	}
	f.keyMacs.New = func() any { return &macScratch{h: hmac.New(sha256.New, secret)} }
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

// Start runs the fleet's sync and returns once its first round has ended
// (a round's timeout at most, twice for a slow dial): a replica then
// decides its first request knowing whether Redis answers and how many
// replicas it counts, not with the N it assumes without them.
func (f *Fleet) Start() {
	f.started = true
	go f.loop()
	if f.cfg.Replicas == 0 {
		// Apart from the claims: an ACL that grants the claims' channel
		// alone refuses a SUBSCRIBE of both.
		f.subscribe(f.beatChannel(), f.hearBeat, func(bool) {},
			"fleet: not hearing the other replicas' heartbeats: they are counted from the members' hash alone, which a FLUSHALL or DEL as often as they beat empties")
	}
	// Rounds go on; a claim is heard at the claimer's next round instead
	// of at once (an ACL without SUBSCRIBE or the channel).
	f.subscribe(f.channel(), f.hear, f.hearing.Store,
		"fleet: not hearing the other replicas' claims: they reach this replica at its next round")
	t := time.NewTimer(2 * time.Duration(f.cfg.Timeout))
	defer t.Stop()
	select {
	case <-f.first:
	case <-t.C:
	}
}

// Close ends the sync (once Start ran) and closes the connections to
// Redis. Call it once, when no engine asks the fleet any more.
func (f *Fleet) Close() {
	close(f.stop)
	if f.started {
		<-f.done
	}
	if f.cfg.Replicas == 0 && f.up.Load() {
		// Leave the members, so that the others stop counting this
		// replica (and holding room for it) now, not once its heartbeat
		// leaves the window: a replica restarted under a new name was
		// counted twice until then. The leave is published too, for the
		// others that heard its heartbeats.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(f.cfg.Timeout))
		hb := f.heartbeat(f.now(), 0)
		f.signLeave(hb)
		if err := f.store.leave(ctx, hb); err != nil {
			f.log.Warn("fleet: could not leave the members at close: the others count this replica until its heartbeat is out of their window", "err", err.Error())
		}
		cancel()
	}
	f.store.close()
}

// Config is the fleet section the fleet runs with, its defaults applied:
// a reload keeps it, since a fleet's settings take a restart.
func (f *Fleet) Config() *config.FleetConfig { return f.cfg }

// channel is where replicas publish their claims on a pool.
func (f *Fleet) channel() string { return f.cfg.Prefix + "claims" }

// beatChannel is where the heartbeats are published (named as the
// members' set is: channels and keys do not meet).
func (f *Fleet) beatChannel() string { return f.cfg.Prefix + "members" }

// signedMembers is the members' hash: in the set's slot (a hash tag of
// its name), so that the heartbeat's script reaches both on a Cluster.
func (f *Fleet) signedMembers() string {
	return f.cfg.Prefix + "{" + f.cfg.Prefix + "members}:signed"
}

// subscribe listens on channel, each message to deliver, and tells
// subscribed true each time it (re)subscribes and false at each failure;
// the first failure after a subscription is logged as warning, but while
// closing (the subscription ends with the client).
func (f *Fleet) subscribe(channel string, deliver func(string), subscribed func(bool), warning string) {
	var warned atomic.Bool
	go f.store.listen(channel, deliver, func() {
		f.commands.Add(1) // SUBSCRIBE
		subscribed(true)
		warned.Store(false)
	}, func(err error) {
		subscribed(false)
		select {
		case <-f.stop:
			return
		default:
		}
		if !warned.Swap(true) {
			f.log.Warn(warning, "channel", channel, "err", err.Error())
		}
	})
}

func (f *Fleet) shard(k []byte) *hotShard {
	var h uint32 = 2166136261
	for _, c := range k {
		h = (h ^ uint32(c)) * 16777619
	}
	return &f.shards[h%uint32(len(f.shards))]
}

// replicas is N: replicas if set, else the replicas that heartbeat now
// or lately (seen). While Redis is unreachable it is the most seen
// lately or kept in the state file, at least min_replicas; before any
// was seen, min_replicas or UnknownReplicas: a replica that cannot
// tell how many others run assumes more, not fewer (docs/fleets.md, How
// a replica counts its peers).
func (f *Fleet) replicas() int64 {
	if f.cfg.Replicas > 0 {
		return int64(f.cfg.Replicas)
	}
	seen := f.seen.Load()
	if f.up.Load() {
		// min_replicas is a floor whether Redis answers or not: a writer
		// without the secret that deletes the members (the signed hash
		// and the set) as fast as they beat makes each replica count
		// itself alone once the most seen lately has passed (31 of a
		// burst of 20 in a review's test, min_replicas 3 set).
		n := max(1, f.n.Load(), seen, int64(f.cfg.MinReplicas))
		if f.beats.Load() < 2 {
			// The first heartbeat counts the replicas that beat before
			// it: of replicas started together, the first counts itself
			// alone. Until the second, one interval later, when every
			// one of them has beaten, it assumes more, not fewer.
			n = max(n, int64(f.cfg.MinReplicas), UnknownReplicas)
		}
		return n
	}
	n := max(seen, int64(f.cfg.MinReplicas))
	if n == 0 {
		return UnknownReplicas
	}
	return n
}

// UnknownReplicas is N while Redis is unreachable and no replicas,
// min_replicas, heartbeat or state file says more: 2, not more, since a
// replica alone (or one of 2) at θ/3 would refuse a client a third of its
// limit; a fleet that gives none of them is warned (SizeWarning,
// warnSizeUnknown).
const UnknownReplicas = 2

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
func (f *Fleet) noteMembers(card, peers int64) {
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	f.beats.Add(1)
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

// Estimate is what the engine decides q against (engine.Fleet): the local
// count, plus the part of θ this replica may not use. A hot key's part is
// θ less its allowance (share.go); a key below its promotion point
// is decided alone, as it cannot hold more than that point; while Redis is
// down every key is decided at θ/N (the local count × N). Mice below a
// quarter of the promotion point cost one comparison: no map, no Redis.
// A request that adds to a key on its first sight past the point promotes
// it; while the key is young its requests claim their counts and wait for
// Redis's answer (claim.go), and the promotion is sent with the first
// claim.
func (f *Fleet) Estimate(q engine.Query) engine.Answer {
	skey, sk, tick, theta, local, add, now := q.Key, q.Local, q.Tick, q.Theta, q.Count, q.Add, q.Now
	n := f.replicas()
	if !f.up.Load() {
		f.promoteDown(&q, n)
		// Its fair share, the request included: the local count × N
		// against θ let each replica count a request past θ/N. Nor
		// more than the room the others left at the last word from
		// Redis: a replica whose count was under θ/N while another's
		// was over it would otherwise add to a key already at θ.
		return engine.Answer{Est: max(alone(local, theta, n), f.othersKnown(skey, sk, tick, theta, local, now))}
	}
	p := sharePoint(theta, n, f.cfg.PromoteFraction)
	if w := f.warmUntil.Load(); now.UnixNano() < w {
		if w == idleWarm && add > 0 {
			// The first request: the warm-up runs stale() from now.
			f.warmUntil.CompareAndSwap(idleWarm, now.UnixNano()+int64(f.stale()))
		}
		p = min(p, fleetWarmPoint)
		if add > 0 && uint64(local)+uint64(add) <= uint64(p) && f.indexed(skey, tick, theta) && (f.count.Load() < int64(f.cfg.MaxHot)/2 || f.isHot(skey)) {
			// Heavy in the fleet lately (the index, index.go): shared
			// from its first request here, which claims, and so are
			// its next (else one below a quarter of the warm-up's
			// point would be decided as a mouse: its first refused,
			// the second got in, in a review). Not made hot past half
			// of max_hot: the index is unsigned, and a writer without
			// the secret who set every bit would otherwise have the
			// warm-up's mice fill the hot set, and every key past it
			// decided alone (26 of 20 for a key the others held, in a
			// review).
			p = 0
		}
	}
	// A key decided alone below its promotion point is held to it:
	// requests in flight together that each read the count below it
	// would otherwise pass it unseen (Answer.Ceiling asks again past it).
	below := uint64(local)+uint64(add) <= uint64(p)
	if below && local < p/4 {
		return engine.Answer{Est: local, Ceiling: p}
	}
	claims := add > 0 && !q.Wallet && !q.Unconditional && !q.NoWait
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	if e != nil && !e.of(&q) {
		// A reload changed the limit (another tick, threshold or sketch)
		// under the same rule and limit names: the entry shares another
		// limit's count, so it goes, and the key is shared anew under a
		// record of its own (keySum hashes the tick and threshold).
		f.drop(s, e)
		e = nil
	}
	if e == nil {
		if below || add == 0 {
			s.mu.Unlock()
			a := engine.Answer{Est: local}
			if below {
				a.Ceiling = p
			}
			return a
		}
		if f.count.Load() >= int64(f.cfg.MaxHot) {
			s.mu.Unlock()
			if f.hotFull.Add(1) == 1 {
				f.log.Warn("fleet: the hot set is full (fleet.max_hot keys shared at once): a key past its promotion point is decided alone at 1/N of its limit until keys cool, so a key the other replicas share may pass the limit by that much here; raise fleet.max_hot above the heavy keys one replica sees at once (sketchproxy_fleet_hot_set_full_total counts these requests)", "max_hot", f.cfg.MaxHot)
			}
			return engine.Answer{Est: alone(local, theta, n)}
		}
		e = f.newEntry(s, &q)
		s.mu.Unlock()
		if r, ok := f.register(e); ok && tickFits(e, &r) {
			// Another replica claimed this key lately: start from its word.
			v, _ := f.viewOf(e, &r, 0, nil)
			e.view.Store(v)
		}
		f.sendSoon(e, false) // a claim that sends first takes it (sendBatch)
	} else {
		s.mu.Unlock()
		if add > 0 {
			e.demand.add(add, now.UnixNano()/int64(tick))
		}
	}
	if e.unsynced.Load() {
		return engine.Answer{Est: alone(local, theta, n)}
	}
	tk := now.UnixNano() / int64(tick)
	v := e.view.Load()
	if q.NoWait && add > 0 && (v == nil || v.young) {
		// A young key that may not wait for its claim: as if Redis were
		// slow (claim.go).
		return f.late(e, &q, n, tk)
	}
	// A young key's requests claim (claim.go) whatever its allowance.
	var top, quiet uint32
	if v != nil && !v.young {
		top, quiet = v.allowance(theta, tk)
	}
	if claims && (v == nil || v.young || pastQuiet(local, add, top, quiet)) {
		if a, ok := f.claim(e, &q, n); ok {
			return a
		}
		// Within what it may count without a word once its turn came,
		// or Redis went down.
		if !f.up.Load() || e.unsynced.Load() {
			return engine.Answer{Est: alone(local, theta, n)}
		}
		if v = e.view.Load(); v != nil {
			top, quiet = v.allowance(theta, tk) // the view of its turn
		}
	} else if v != nil && v.young {
		top, quiet = v.allowance(theta, tk)
	}
	if v == nil {
		// Promoted, not yet answered (a round trip): its fair share, or a
		// request where that holds none; what it counts is published.
		return engine.Answer{Est: alone(local, theta, n), Tell: true}
	}
	est := estimateAt(local, theta, top)
	if v.suspect {
		est = max(est, alone(local, theta, n))
	}
	a := engine.Answer{Est: est, Tell: uint64(local)+uint64(add) > uint64(quiet)}
	if claims && !v.young && quiet < top {
		// Requests in flight together that each read the count within
		// what it may count without a word would pass it together
		// unclaimed: the engine's
		// conditional add holds them to it, and one the others pushed
		// past it asks again, and claims (21 of 20 for 900 requests at
		// once over 3 replicas in a review's test, without).
		a.Ceiling = quiet
	}
	return a
}

// isHot reports whether skey is in the hot set.
func (f *Fleet) isHot(skey []byte) bool {
	s := f.shard(skey)
	s.mu.Lock()
	_, ok := s.m[string(skey)]
	s.mu.Unlock()
	return ok
}

// promoteDown makes q's key hot while Redis is down, past its promotion
// point, without a send: what this replica admits of it alone then is in
// its record from its first round once Redis answers (round sends every
// hot key), so that the others, once every replica has had that round,
// may trust the records again (recovering). A key it had not shared
// before was decided alone past the point and never written. An entry of
// a limit a reload changed is replaced, as Estimate replaces it. With
// max_hot entries already, the key is decided alone and not written, as
// while Redis answers.
func (f *Fleet) promoteDown(q *engine.Query, n int64) {
	if q.Add == 0 || uint64(q.Count)+uint64(q.Add) <= uint64(sharePoint(q.Theta, n, f.cfg.PromoteFraction)) || f.count.Load() >= int64(f.cfg.MaxHot) {
		return
	}
	s := f.shard(q.Key)
	s.mu.Lock()
	if e := s.m[string(q.Key)]; e != nil {
		if e.of(q) {
			s.mu.Unlock()
			return
		}
		f.drop(s, e) // a reload changed the limit (Estimate)
	}
	e := f.newEntry(s, q)
	s.mu.Unlock()
	f.register(e)
}

// of reports whether e counts q's limit: the same sketch, tick and
// threshold (a reload may change them under the same rule and limit
// names).
func (e *hotEntry) of(q *engine.Query) bool {
	return e.sk == q.Local && e.tick == q.Tick && e.theta == q.Theta
}

// newEntry makes q's key a hot entry of shard s (s.mu held).
func (f *Fleet) newEntry(s *hotShard, q *engine.Query) *hotEntry {
	e := &hotEntry{skey: append([]byte(nil), q.Key...), sk: q.Local, tick: q.Tick, theta: q.Theta, since: q.Now.UnixNano(),
		claiming: make(chan struct{}, 1), id: f.ids.Add(1)}
	if e.id == 0 {
		e.id = f.ids.Add(1) // 0 is no hold
	}
	sum := f.keySum(q.Key, q.Tick, q.Theta)
	e.rkey, e.marker = f.keyNames(sum[:])
	e.bit = indexBit(sum[:])
	e.demand.start(uint32(min(uint64(q.Count)+uint64(q.Add), math.MaxUint32)), q.Now.UnixNano()/int64(q.Tick))
	s.m[string(e.skey)] = e
	f.count.Add(1)
	f.promotions.Add(1)
	return e
}

// register names e by its key in Redis, for the claims other replicas
// publish, and returns the latest claim heard of it before, if any.
func (f *Fleet) register(e *hotEntry) (r shareReply, ok bool) {
	f.rmu.Lock()
	defer f.rmu.Unlock()
	f.rkeys[e.rkey] = e
	r, ok = f.heard[e.rkey]
	delete(f.heard, e.rkey)
	return r, ok
}

// pastQuiet reports whether a request adding add to local takes this
// replica's count of a key past quiet, what it may count without a word
// (its guarantee, and what Redis holds for it past that), and not past
// top, what it may reach (a key past its first two intervals): a claim on
// the pool's room, which it waits for (claim.go). Deciding it from the view and publishing it after
// let every replica's requests in flight together take the whole room
// each had last seen (36 of a burst of 20 for 90 requests at once over 3
// replicas, a key past its first two intervals, no fault). Where θ/N
// holds no whole request no replica holds a guarantee (share.go,
// guarantee), so every admitted request past what Redis holds claims:
// decided from the view, requests at once on each replica passed the
// burst by a request per replica (5 of 3 in TestFleetProcessSmallLimitAtOnce).
func pastQuiet(local, add, top, quiet uint32) bool {
	c := uint64(local) + uint64(add)
	return c > uint64(quiet) && c <= uint64(top)
}

// alone is the estimate of a key this replica decides by itself at its
// fair share θ/N (at least one request).
func alone(local, theta uint32, n int64) uint32 {
	top := max(fairShare(theta, n), shareUnit)
	return estimateAt(local, theta, top)
}

// estimateAt is the estimate of a key whose count here is local and may
// reach top of θ: local plus the part of θ this replica may not use.
func estimateAt(local, theta, top uint32) uint32 {
	return uint32(min(uint64(local)+uint64(theta-min(theta, top)), math.MaxUint32))
}

// Counted is told that a request Estimate asked about counted in k: a
// claim on the pool (or a count while the key awaits its first answer),
// which the other replicas must see before their next request. It is sent
// and published at once.
func (f *Fleet) Counted(skey []byte) {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e != nil {
		f.sendSoon(e, true)
	}
}

// sendSoon queues e to be sent at once; loud, with its claim published.
func (f *Fleet) sendSoon(e *hotEntry, loud bool) {
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
func (f *Fleet) WalletsClosed() (bool, time.Duration) {
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

// keyNames are a key's name in Redis, the keyed hash of the sketch key
// and of its limit's tick and threshold (sum, keySum: Redis never sees a
// client address or an API key, and a limit changed at a reload counts
// apart from the old one's record), and the run marker of its hash tag.
func (f *Fleet) keyNames(sum []byte) (key, marker string) {
	tag := f.cfg.Prefix + "{t" + strconv.Itoa(int(sum[16])%fleetTags) + "}"
	return tag + "k:" + hex.EncodeToString(sum[:16]), tag + "run"
}

// keySum is HMAC-SHA256(secret, sketch key, its limit's tick and
// threshold): the key's name in Redis (keyNames) and its bit in the
// index of heavy keys (index.go), which requests of a warm-up ask: a
// pooled HMAC and its scratch, so that it allocates nothing.
func (f *Fleet) keySum(skey []byte, tick time.Duration, theta uint32) (sum [sha256.Size]byte) {
	m, _ := f.keyMacs.Get().(*macScratch)
	if m == nil {
		m = &macScratch{h: hmac.New(sha256.New, f.secret)} // a Fleet made without newFleetOn
	}
	m.h.Reset()
	m.h.Write(skey)
	binary.LittleEndian.PutUint64(m.lim[:8], uint64(tick))
	binary.LittleEndian.PutUint32(m.lim[8:], theta)
	m.h.Write(m.lim[:])
	m.h.Sum(m.sum[:0])
	sum = m.sum
	f.keyMacs.Put(m)
	return sum
}

// macScratch is a pooled HMAC with the secret (keySum's) and its
// scratch.
type macScratch struct {
	h   hash.Hash
	lim [12]byte
	sum [sha256.Size]byte
}
