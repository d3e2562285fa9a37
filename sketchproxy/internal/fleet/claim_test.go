package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// hotOf is replica i's one hot entry (nil: none).
func (s *fleetSim) hotOf(i int) *hotEntry {
	f := s.fleets[i]
	for j := range f.shards {
		f.shards[j].mu.Lock()
		for _, h := range f.shards[j].m {
			f.shards[j].mu.Unlock()
			return h
		}
		f.shards[j].mu.Unlock()
	}
	return nil
}

// A claim whose send failed (Redis slow, or the request's time spent
// waiting for the sends ahead of it) may or may not be in the record: the
// next request must not take it as written. Found by a review: 21 of 20.
func TestFleetClaimFailedNotTaken(t *testing.T) {
	for _, fail := range []bool{false, true} {
		s := newFleetSim(t, 2, rate.Rate{Requests: 20, Per: time.Minute}, 2)
		s.run(s.clk.Now().Add(2 * time.Second))
		admitted := 0
		for range 11 {
			if s.decide(0, "k") {
				admitted++
			}
		}
		if fail {
			s.store.down = true // this claim's send fails
			if s.decide(0, "k") {
				admitted++
			}
			s.store.down = false
		}
		admitted += s.admits(1, "k", 20) + s.admits(0, "k", 5)
		alone := 0
		for range 40 {
			if s.decide(-1, "k") {
				alone++
			}
		}
		t.Logf("a claim's send failed: %v; 2 replicas admitted %d, one alone %d", fail, admitted, alone)
		if admitted > alone {
			t.Errorf("a claim's send failed: %v; 2 replicas admitted %d of a burst of %d", fail, admitted, alone)
		}
	}
}

// gateLocal is a sketch whose next read, once gated, waits for the test.
type gateLocal struct {
	c             atomic.Uint32
	gate          atomic.Bool
	read, proceed chan struct{}
}

func (l *gateLocal) EstimateBytes([]byte) uint32 {
	v := l.c.Load()
	if l.gate.Swap(false) {
		l.read <- struct{}{}
		<-l.proceed
	}
	return v
}

func (l *gateLocal) EstimateBytesAt(_ time.Time, k []byte) uint32 { return l.EstimateBytes(k) }

// A request counted and settled while another sizes its claim is counted
// once at least, never missed: the holds are read before the count.
func TestFleetClaimNeedSeesSettled(t *testing.T) {
	l := &gateLocal{read: make(chan struct{}), proceed: make(chan struct{})}
	l.c.Store(10)
	skey := []byte("api\x00rate\x00k")
	f := &Fleet{}
	for i := range f.shards {
		f.shards[i].m = map[string]*hotEntry{}
	}
	e := &hotEntry{skey: skey, sk: l, tick: time.Second, theta: 40, claiming: make(chan struct{}, 1), id: 1}
	f.shard(skey).m[string(skey)] = e
	e.granted, e.confirmed, e.handed = 12, 12, 2 // one request admitted by its claim, in flight
	q := engine.Query{Key: skey, Local: l, Tick: time.Second, Theta: 40, Count: 10, Add: 2}
	l.gate.Store(true)
	got := make(chan uint64)
	go func() { got <- e.need(&q, 0) }()
	<-l.read
	l.c.Store(12)                 // the one in flight counted
	f.Settle(skey, e.id, 2, true) // and settled
	close(l.proceed)
	if need := <-got; need < 14 {
		t.Errorf("need %d with the request in flight counted (12) and this one's 2: want 14 at least", need)
	}
}

// A key promoted from a claim heard (not young any more) is sent at once,
// not at the next round.
func TestFleetPromotedFromHeardIsSent(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 20, Per: time.Minute}, 3)
	t0 := s.clk.Now().Add(2 * time.Second)
	for j := range 30 {
		s.at(t0.Add(time.Duration(j)*100*time.Millisecond), func() { s.decide(0, "k") })
	}
	s.run(t0.Add(3 * time.Second))
	f1 := s.fleets[1]
	f1.rmu.Lock()
	heard := len(f1.heard)
	f1.rmu.Unlock()
	if heard == 0 {
		t.Fatal("replica 1 heard no claim of the key: the case measures nothing")
	}
	var e *hotEntry
	for range 6 {
		s.decide(1, "k")
		if e = s.hotOf(1); e != nil {
			break
		}
	}
	if e == nil {
		t.Fatal("replica 1 did not promote the key")
	}
	if !e.pending.Load() && !e.answered.Load() {
		t.Errorf("a key promoted from a claim heard is neither sent nor queued: its record waits for the next round")
	}
}

// Requests that count nothing (negative hits) and rules that count
// whatever the answer (shadow) claim nothing: no wait on Redis, no room
// held in the record.
func TestFleetNoClaimWithoutCount(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 20, Per: time.Minute}, 3)
	s.run(s.clk.Now().Add(2 * time.Second))
	for range 6 {
		s.decide(0, "k")
	}
	f, e := s.fleets[0], s.hotOf(0)
	if e == nil || e.view.Load() == nil || !e.view.Load().young {
		t.Fatal("the key is not hot and young on replica 0: the case measures nothing")
	}
	claims := f.claims.Load()
	for range 5 {
		s.sc.Reset()
		facts := [1]engine.Fact{{Rule: s.sets[0].Rules[0], Key: "k", Negative: true, Hits: 3}}
		d := s.engs[0].Decide(context.Background(), s.sets[0], s.clk.Now(), &engine.Request{Facts: facts[:], NoDrip: true}, &s.sc)
		d.Done()
	}
	if n := f.claims.Load() - claims; n > 0 {
		t.Errorf("5 requests of negative hits sent %d claims", n)
	}
	sh := newFleetSimRule(t, 3, engine.RuleSpec{Name: "api", Shadow: true, Limits: []engine.LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 20, Per: time.Minute}}}}, 3)
	sh.run(sh.clk.Now().Add(2 * time.Second))
	for range 30 {
		sh.decide(0, "k")
	}
	if n := sh.fleets[0].claims.Load(); n > 0 {
		t.Errorf("30 requests of a shadow rule's young key sent %d claims: a rule that never refuses waited on Redis", n)
	}
}

// slowStore fails every send of one replica (it times out) while the
// others' go through.
type slowStore struct {
	*memStore
	slow bool
}

func (s *slowStore) sync(ctx context.Context, r *shareRound, calls []shareCall, beat *heartbeat) ([]shareReply, *beatReply, int, error) {
	if s.slow {
		return make([]shareReply, len(calls)), nil, len(calls), context.DeadlineExceeded
	}
	return s.memStore.sync(ctx, r, calls, beat)
}

// A replica whose claims time out decides as while Redis is down: at
// θ/N, its count published. Redis slow for every replica, a burst within
// the limit is admitted whole and one past it held to it; one replica cut
// off while Redis answers the other may count its θ/N unseen, as during
// any outage of its own (23 of 20 in a review, at most the burst and θ/N
// here).
func TestFleetLateClaims(t *testing.T) {
	for _, c := range []struct {
		name  string
		slow  []int // the replicas whose sends time out
		burst int   // requests sent, round robin over the slow ones first
	}{{"all slow, within the limit", []int{0, 1}, 20}, {"all slow, past it", []int{0, 1}, 40}, {"one slow", []int{0}, 0}} {
		s := newFleetSim(t, 2, rate.Rate{Requests: 20, Per: time.Minute}, 2)
		s.run(s.clk.Now().Add(2 * time.Second))
		st := &slowStore{memStore: s.store, slow: true}
		for _, i := range c.slow {
			s.fleets[i].store = st
		}
		var admitted, alone int
		if c.burst > 0 {
			for j := range c.burst {
				if s.decide(j%2, "k") {
					admitted++
				}
				if s.decide(-1, "k") {
					alone++
				}
			}
		} else {
			for range 20 {
				if s.decide(0, "k") {
					admitted++
				}
			}
			st.slow = false
			for range 30 {
				if s.decide(1, "k") {
					admitted++
				}
			}
			for range 40 {
				if s.decide(-1, "k") {
					alone++
				}
			}
		}
		t.Logf("%s: the fleet admitted %d, one replica alone %d", c.name, admitted, alone)
		most := alone
		if len(c.slow) == 1 {
			most += int(fairShare(40, 2) / 2)
		}
		if admitted > most {
			t.Errorf("%s: the fleet admitted %d, one replica alone %d: want at most %d", c.name, admitted, alone, most)
		}
		if c.burst == 20 && admitted < 20 {
			t.Errorf("%s: %d of a burst of 20 within the limit admitted: claims timing out refused a client under its limit", c.name, admitted)
		}
	}
}

// A hold names its entry: a request held on an entry since dropped and
// made anew (a reload, a demotion) settles nothing of the new one's.
func TestFleetSettleNamesItsEntry(t *testing.T) {
	skey := []byte("api\x00rate\x00k")
	f := &Fleet{}
	for i := range f.shards {
		f.shards[i].m = map[string]*hotEntry{}
	}
	cur := &hotEntry{skey: skey, tick: time.Second, theta: 20, id: 2}
	cur.handed = 2
	f.shard(skey).m[string(skey)] = cur
	f.Settle(skey, 1, 2, false) // held on entry 1, dropped since
	if cur.handed != 2 {
		t.Errorf("a hold of a dropped entry released the new one's: handed %d, want 2", cur.handed)
	}
	f.Settle(skey, 2, 2, true)
	if cur.handed != 0 {
		t.Errorf("the entry's own hold left handed at %d, want 0", cur.handed)
	}
}

// rttStore is a memStore a round trip away.
type rttStore struct {
	*memStore
	rtt time.Duration
}

func (s *rttStore) sync(ctx context.Context, r *shareRound, calls []shareCall, beat *heartbeat) ([]shareReply, *beatReply, int, error) {
	time.Sleep(s.rtt)
	return s.memStore.sync(ctx, r, calls, beat)
}

// Claims that wait at once go in one send, whatever their keys, and a
// claim covers the requests of its key waiting behind it: 64 fresh keys
// of one replica, 8 requests each at once, Redis 2 ms away. One send a
// claim, one at a time, kept requests 250 ms (the timeout) at the median
// in a review; batched, 10 ms. On the wall clock, with goroutines: the
// test holds only that sends carried several claims each, and logs the
// latencies.
func TestFleetClaimsBatched(t *testing.T) {
	store := &rttStore{memStore: newMemStore(time.Now), rtt: 2 * time.Millisecond}
	cfg := simFleetConfig("r0", 3)
	cfg.Timeout = config.Duration(250 * time.Millisecond)
	f := newFleetOn(cfg, []byte("0123456789abcdef"), store, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	f.Start()
	defer f.Close()
	e := engine.New(engine.Options{Seed: 1, Fleet: f})
	set, err := e.Compile(&engine.Spec{
		Buckets: 1 << 12,
		Rules:   []engine.RuleSpec{{Name: "api", Limits: []engine.LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 20, Per: time.Minute}}}}},
		Tarpit:  engine.TarpitSpec{BanFor: time.Minute, MaxHeld: 1, MaxHeldPerKey: 1},
		NewKeys: engine.NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Retire(set, nil)
	var mu sync.Mutex
	var lat []time.Duration
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for k := range 64 {
		for range 8 {
			wg.Go(func() {
				var sc engine.Scratch
				facts := [1]engine.Fact{{Rule: set.Rules[0], Key: fmt.Sprint("client-", k)}}
				t0 := time.Now()
				d := e.Decide(context.Background(), set, time.Now(), &engine.Request{Facts: facts[:], NoDrip: true}, &sc)
				el := time.Since(t0)
				if d.Admitted {
					admitted.Add(1)
				}
				d.Done()
				mu.Lock()
				lat = append(lat, el)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	slices.Sort(lat)
	sends, carried := f.batches.Load(), f.batched.Load()
	t.Logf("512 requests of 64 fresh keys, Redis 2 ms away: p50 %v, p90 %v, max %v; %d admitted; %d claims' sends carried %d entries",
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*9/10].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond), admitted.Load(), sends, carried)
	if sends == 0 {
		t.Fatal("no claim was sent: the case measures nothing")
	}
	if carried < 2*sends {
		t.Errorf("%d sends carried %d claims: claims waiting at once are not batched", sends, carried)
	}
	if admitted.Load() != 512 {
		t.Errorf("%d of 512 admitted: 8 requests of a key at 20 a minute are within its burst", admitted.Load())
	}
}

// ctxStore is a memStore d away that gives up at its context's end.
type ctxStore struct {
	*memStore
	d time.Duration
}

func (s *ctxStore) sync(ctx context.Context, r *shareRound, calls []shareCall, beat *heartbeat) ([]shareReply, *beatReply, int, error) {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return make([]shareReply, len(calls)), nil, len(calls), ctx.Err()
	}
	return s.memStore.sync(ctx, r, calls, beat)
}

type atomicLocal struct{ c atomic.Uint32 }

func (l *atomicLocal) EstimateBytes([]byte) uint32 { return l.c.Load() }

func (l *atomicLocal) EstimateBytesAt(time.Time, []byte) uint32 { return l.c.Load() }

// A batch goes out until the latest of its waiters' deadlines: a waiter
// with little time left that happens to send it does not fail the others
// (a review: both failed with the first's 30 ms, Redis 40 ms away).
func TestFleetClaimBatchDeadline(t *testing.T) {
	store := &ctxStore{memStore: newMemStore(time.Now), d: 40 * time.Millisecond}
	f := newFleetOn(simFleetConfig("r0", 2), []byte("0123456789abcdef"), store, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Now)
	f.up.Store(true)
	entry := func(key string) *hotEntry {
		skey := []byte("api\x00rate\x00" + key)
		l := &atomicLocal{}
		l.c.Store(10)
		e := &hotEntry{skey: skey, sk: l, tick: 42 * time.Second, theta: 41, claiming: make(chan struct{}, 1), id: f.ids.Add(1), since: time.Now().UnixNano()}
		e.rkey, e.marker = f.redisKeys(skey, e.tick, e.theta)
		f.shard(skey).m[string(skey)] = e
		return e
	}
	a, b := entry("a"), entry("b")
	f.sending <- struct{}{} // a round in flight
	ra, rb := make(chan bool, 1), make(chan bool, 1)
	go func() { _, ok := f.sendClaim(a, time.Now().Add(30*time.Millisecond)); ra <- ok }()
	time.Sleep(5 * time.Millisecond)
	go func() { _, ok := f.sendClaim(b, time.Now().Add(2*time.Second)); rb <- ok }()
	time.Sleep(5 * time.Millisecond)
	<-f.sending // the round ends
	okA, okB := <-ra, <-rb
	t.Logf("A (30 ms left): %v; B (2 s left): %v; %d sends carried %d", okA, okB, f.batches.Load(), f.batched.Load())
	if !okB {
		t.Errorf("B, with 2 s left and Redis 40 ms away, failed with A's deadline")
	}
}

// A replica gone (restarted under a new name) leaves a record that lives
// as long as its count: it is not a replica N's floor counts once it is
// unwritten past stale (a review: N read 4 of 3 for hours under an
// hourly limit after one restart, and clients under their limit were
// refused).
func TestFleetLivePeers(t *testing.T) {
	now := int64(1_000_000_000)
	stale := 3 * time.Second
	peers := []peerShare{{id: "a", ts: now}, {id: "b", ts: now - 2_000_000}, {id: "gone", c: 40, ts: now - 4_000_000}}
	if n := livePeers(peers, now, stale); n != 2 {
		t.Errorf("livePeers = %d, want 2: a record unwritten past stale counted as a replica", n)
	}
}

// After a replica restarts under a new name, its predecessor's record of
// a hot key lives on until its count halves away; the replicas count 3,
// not 4, once it is unwritten past stale.
func TestFleetRestartNoPhantomReplica(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 20, Per: time.Minute}, 0)
	t0 := s.clk.Now().Add(2 * time.Second)
	for j := range 60 {
		s.at(t0.Add(time.Duration(j)*100*time.Millisecond), func() { s.decide(j%3, "k") })
	}
	s.at(t0.Add(3*time.Second), func() { s.restart(2, "r2.1") })
	for j := range 60 {
		s.at(t0.Add(4*time.Second+time.Duration(j)*100*time.Millisecond), func() { s.decide(j%3, "k") })
	}
	s.run(t0.Add(15 * time.Second))
	for i, f := range s.fleets {
		if n := f.replicas(); n != 3 {
			t.Errorf("replica %d counts %d replicas, want 3: the restarted one's predecessor still counts", i, n)
		}
	}
}

// A claim is written only where it fits beside what the others' records
// hold (shareScript), and the script cannot tell a made-up record from a
// genuine one: a writer without the secret that adds a replica with a
// huge count has every claim refused there. The replica believes only
// the records that verify; where they left room, it decides as while
// Redis is down (θ/N), so a client of a key just shared is not refused
// because of the record: 2 replicas at 20 a minute, a made-up record of
// 1,000 requests, each replica admits its half of the burst (8 of 20 in
// all when the replicas refused where the script did).
func TestFleetClaimBesideForgedRecord(t *testing.T) {
	s := newFleetSim(t, 2, rate.Rate{Requests: 20, Per: time.Minute}, 2)
	s.run(s.clk.Now().Add(2 * time.Second))
	for range 6 { // past the promotion point on replica 0: shared
		s.decide(0, "k")
	}
	e := s.hotOf(0)
	if e == nil {
		t.Fatal("the key is not shared after 6 requests")
	}
	s.store.mu.Lock()
	k := s.store.keys[e.rkey]
	if k == nil {
		s.store.mu.Unlock()
		t.Fatal("the key has no records")
	}
	tk := s.clk.Now().UnixNano() / int64(e.tick)
	k.recs["ghost"] = signedRec{id: "ghost", c: 2000, d: 2000, at: tk, ts: s.clk.Now().UnixMicro(), mac: "00000000000000000000000000000000"}
	s.store.mu.Unlock()
	var admitted [2]int
	for range 30 {
		for i := range 2 {
			if s.decide(i, "k") {
				admitted[i]++
			}
		}
	}
	t.Logf("beside a made-up record of 1,000 requests: replica 0 admitted %d more, replica 1 %d", admitted[0], admitted[1])
	// Each replica at θ/N, 10 requests: the burst of 20 (8 when every
	// claim beside the record was refused).
	if got := admitted[0] + admitted[1] + 6; got > 20 || got < 18 {
		t.Errorf("2 replicas admitted %d of a burst of 20 beside a made-up record, want 18 to 20", got)
	}
}

// sketchproxy_fleet_claims_total counts the claims the script published:
// a batch of claims whose send failed publishes them again at the next
// send, and each counted once (it counted at each try before).
func TestFleetClaimsCountedWhenPublished(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	st := newMemStore(clk.Now)
	f := hostileFleet(t, st, clk.Now, 2)
	e := hostileEntry(f, "k", 20, 2)
	e.loud.Store(true)
	st.down = true
	b := &claimBatch{es: []*hotEntry{e}, deadline: time.Now().Add(time.Second), done: make(chan struct{})}
	f.sending <- struct{}{}
	f.sendBatch(b)
	<-f.sending
	if b.ok || !e.loud.Load() {
		t.Fatalf("a batch sent while Redis is down: ok %v, its claim to publish again %v; want false, true", b.ok, e.loud.Load())
	}
	st.down = false
	if !f.send([]*hotEntry{e}, false) {
		t.Fatal("the send failed")
	}
	if n := len(st.queued); n != 1 {
		t.Fatalf("%d claims published, want 1", n)
	}
	if got := f.Stats().Claims; got != 1 {
		t.Errorf("claims_total %d for one claim published (its first send failed), want 1", got)
	}
}

// The same beside a limit whose θ/N holds no whole request (1 a second
// over 3 replicas): a made-up record has every conditional claim of a
// key refused by the script, and deciding at θ/N there let each replica
// admit one request: 3 of a burst of 1 (a review's test through Redis).
// The claim goes again unconditionally and is decided from the records
// that verify: 1.
func TestFleetClaimBesideForgedRecordSmallLimit(t *testing.T) {
	limit := rate.Rate{Requests: 1, Per: time.Second}
	// The key's name in Redis, as a writer learns it from the claims
	// channel (the same secret names it alike in every fleet).
	first := newFleetSim(t, 3, limit, 3)
	first.run(first.clk.Now().Add(2 * time.Second))
	first.decide(0, "k")
	e := first.hotOf(0)
	if e == nil {
		t.Fatal("the key is not shared at its first request")
	}
	s := newFleetSim(t, 3, limit, 3)
	s.run(s.clk.Now().Add(2 * time.Second))
	tk := s.clk.Now().UnixNano() / int64(e.tick)
	s.store.mu.Lock()
	s.store.keys[e.rkey] = &memKey{born: s.clk.Now().UnixMicro(), recs: map[string]signedRec{
		"ghost": {id: "ghost", c: 2000, d: 2000, at: tk + 1000, ts: s.clk.Now().UnixMicro(), mac: "00000000000000000000000000000000"},
	}}
	s.store.mu.Unlock()
	admitted := 0
	for i := range 3 {
		if s.decide(i, "k") {
			admitted++
		}
	}
	t.Logf("beside a made-up record, 3 replicas admitted %d of a key's first 3 requests at 1 a second (one on each)", admitted)
	if admitted != 1 {
		t.Errorf("3 replicas admitted %d of a burst of 1 beside a made-up record", admitted)
	}
}
