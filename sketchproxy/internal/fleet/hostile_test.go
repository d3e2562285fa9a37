package fleet

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// fixedLocal is a sketch that holds c for every key.
type fixedLocal uint32

func (c fixedLocal) EstimateBytes([]byte) uint32 { return uint32(c) }

func (c fixedLocal) EstimateBytesAt(time.Time, []byte) uint32 { return uint32(c) }

func hostileFleet(t testing.TB, store fleetStore, now func() time.Time, replicas int) *Fleet {
	t.Helper()
	cfg := &config.FleetConfig{Replicas: replicas, ID: "r0", Interval: config.Duration(500 * time.Millisecond),
		Timeout: config.Duration(250 * time.Millisecond), PromoteFraction: 0.5, MaxHot: 10000, Prefix: "sketchproxy:", WalletOnFailure: "closed"}
	return newFleetOn(cfg, []byte("0123456789abcdef"), store, slog.New(slog.NewTextHandler(io.Discard, nil)), now)
}

// redisKeys are the names in Redis of the sketch key skey of a limit of
// tick and theta (keySum, keyNames), as a hot entry has them.
func (f *Fleet) redisKeys(skey []byte, tick time.Duration, theta uint32) (key, marker string) {
	sum := f.keySum(skey, tick, theta)
	return f.keyNames(sum[:])
}

// hostileEntry puts key k (threshold theta, tick 1 s, local count c) in
// f's hot set, as a promotion does.
func hostileEntry(f *Fleet, k string, theta, c uint32) *hotEntry {
	e := &hotEntry{skey: []byte(k), sk: fixedLocal(c), tick: time.Second, theta: theta}
	e.rkey, e.marker = f.redisKeys(e.skey, e.tick, e.theta)
	s := f.shard(e.skey)
	s.mu.Lock()
	s.m[k] = e
	s.mu.Unlock()
	f.count.Add(1)
	f.rmu.Lock()
	f.rkeys[e.rkey] = e
	f.rmu.Unlock()
	return e
}

// A claim is published through Redis by whoever may PUBLISH on the
// channel; its records are signed (fleet.sign), its head ("tick born now")
// is not, and may be made up around genuine records. One that says it is
// from the far future must not pin the view: the replica's own rounds
// must go on replacing it, or a single forged message would hold a key's
// view (nobody else counts anything) for as long as it stays hot. One
// dated 40 ticks on must not halve the counts it carries to nothing.
func TestFleetForgedClaimCannotPinAView(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	store := newMemStore(clk.Now)
	f := hostileFleet(t, store, clk.Now, 2)
	e := hostileEntry(f, "client", 20, 10)
	if !f.send([]*hotEntry{e}, false) {
		t.Fatal("the round failed")
	}
	good := e.view.Load()
	if good == nil {
		t.Fatal("no view after a round")
	}
	// Far in the future, a genuine record of another replica.
	r1 := signedRec{id: "r1", c: 6, d: 6, at: good.tick, ts: good.at}
	far := good.at + int64(100*365*24*time.Hour/time.Microsecond)
	f.hear(signedClaim(f, e.rkey, far/int64(time.Second/time.Microsecond), good.at, far, r1))
	clk.Advance(600 * time.Millisecond)
	if !f.send([]*hotEntry{e}, false) {
		t.Fatal("the round failed")
	}
	if v := e.view.Load(); v.at == far {
		t.Fatalf("a forged claim from the future pinned the view (at %d); the replica's own round did not replace it", v.at)
	}
	// A claim whose head's tick does not match its records': its counts
	// are read at the tick they were signed at.
	now := e.view.Load().at
	r1.c, r1.ts = 8, now
	f.hear(signedClaim(f, e.rkey, now/int64(time.Second/time.Microsecond)+40, good.at, now+1, r1))
	v := e.view.Load()
	if v.tick > good.tick+1 || len(v.others) != 1 || v.others[0].c != 8 {
		t.Fatalf("a claim headed 40 ticks past its records read as tick %d (signed at %d), others %+v: want r1's 8 counts", v.tick, good.tick, v.others)
	}

	// Heard before this replica's first reply (nothing to check it
	// against): its own round replaces it.
	f2 := hostileFleet(t, store, clk.Now, 2)
	e2 := hostileEntry(f2, "client2", 20, 10)
	f2.hear(signedClaim(f2, e2.rkey, far/int64(time.Second/time.Microsecond), good.at, far, r1))
	if !f2.send([]*hotEntry{e2}, false) {
		t.Fatal("the round failed")
	}
	if v := e2.view.Load(); v == nil || v.at == far {
		t.Fatal("a forged claim heard before the first round pinned the view")
	}
}

// signedClaim is a claim of key rkey headed "tick born now" carrying recs,
// each signed with f's secret (as the replicas that wrote them would).
func signedClaim(f *Fleet, rkey string, tick, born, now int64, recs ...signedRec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d %d %d", rkey, tick, born, now)
	for _, r := range recs {
		r.mac = f.macOf(rkey, &r)
		fmt.Fprintf(&b, " %s %s", r.id, r.String())
	}
	return b.String()
}

// One hot key whose record Redis cannot run the script on (a key of
// another type, written by someone else under the fleet's prefix; a hash
// with more fields than Lua can unpack) is that key's problem: the
// other keys stay synced and the fleet stays up. Before, the pipeline's
// first error failed the whole round at every interval for as long as
// the key stayed hot (it is demoted only after a good round): every key
// fell back to θ/N and budget routes answered 503.
func TestFleetPoisonedKeyDoesNotDownTheFleet(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	f := hostileFleet(t, rs, time.Now, 0)
	defer f.store.close()
	bad := hostileEntry(f, "wrongtype", 20, 10)
	wide := hostileEntry(f, "wide", 20, 10)
	good := hostileEntry(f, "good", 20, 10)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Set(ctx, bad.rkey, "junk", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var fields []any
	for i := range 20000 {
		fields = append(fields, fmt.Sprint("r:junk", i), "x")
	}
	if err := rdb.HSet(ctx, wide.rkey, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	if !f.round() {
		t.Fatal("one key of another type failed the whole round")
	}
	if !f.up.Load() {
		t.Fatal("the fleet went down")
	}
	if good.view.Load() == nil {
		t.Fatal("the good key was not synced")
	}
	if wide.view.Load() == nil {
		t.Fatal("a hash with 20,000 junk fields was not synced (its junk dropped)")
	}
	if n, _ := rdb.HLen(ctx, wide.rkey).Result(); n > 5 {
		t.Fatalf("the junk fields stayed: %d fields", n)
	}
	if bad.view.Load() != nil {
		t.Fatal("a key of another type got a view")
	}
	if !strings.HasPrefix(bad.rkey, "sketchproxy:{t") {
		t.Fatal(bad.rkey)
	}
}

// The members are counted on Redis's clock, as the records are: two
// replicas whose clocks are 10 s apart each count both. Before, the
// heartbeat's score and the window it pruned by were each replica's own
// clock: the replica ahead dropped the other's entry at each of its beats
// and counted itself alone (N = 1: its fair share was the whole θ), and
// an entry written with a score in the future (a clock ahead, or anyone
// writing to the set) was never dropped, and counted for ever. A
// replica's first beat is dated by its own clock (it has no word from
// Redis yet), and one 10 s off is out of the window: it counts from its
// second, dated by Redis's time its first reply carried.
func TestFleetHeartbeatOnRedisClock(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	defer rs.close()
	replica := func(id string, skew time.Duration) *Fleet {
		f := hostileFleet(t, rs, func() time.Time { return time.Now().Add(skew) }, 0)
		f.self = id
		return f
	}
	beat := func(f *Fleet) int64 {
		if !f.send(nil, true) {
			t.Fatal("the heartbeat failed")
		}
		return f.n.Load()
	}
	behind, ahead := replica("behind", -10*time.Second), replica("ahead", 10*time.Second)
	beat(behind)
	beat(ahead)
	beat(behind)
	if n := beat(ahead); n != 2 {
		t.Errorf("the replica 10 s ahead counts %d replicas, want 2", n)
	}
	if n := beat(behind); n != 2 {
		t.Errorf("the replica 10 s behind counts %d replicas, want 2", n)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	rdb.ZAdd(context.Background(), "sketchproxy:members", redis.Z{Score: 1e15, Member: "forged"})
	if n := beat(ahead); n != 2 {
		t.Errorf("an entry dated in the future is counted: %d replicas, want 2", n)
	}
}

// Anyone who may write to Redis may add to the members: replicas that
// counted the members' sorted set (ZCARD) counted every entry added to
// it, so a writer without the secret made each replica count 50 peers
// more, take a fiftieth of its share and refuse clients under their
// limit (and share every key from its first request, a Redis command a
// request). The members are signed: entries made up (in the sorted set or
// in the signed hash, with a fresh time and any MAC), an entry copied
// under another id, and a genuine entry replayed past the window are not
// counted, and say so in sketchproxy_fleet_records_rejected_total.
func TestFleetMembersForged(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	defer rs.close()
	a, b := hostileFleet(t, rs, time.Now, 0), hostileFleet(t, rs, time.Now, 0)
	a.self, b.self = "a", "b"
	for range 2 {
		for _, f := range []*Fleet{a, b} {
			if !f.send(nil, true) {
				t.Fatal("the heartbeat failed")
			}
		}
	}
	if n := a.n.Load(); n != 2 {
		t.Fatalf("2 replicas count %d, want 2", n)
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	signed := "sketchproxy:{sketchproxy:members}:signed"
	old, err := rdb.HGet(ctx, signed, b.self).Result()
	if err != nil {
		t.Fatalf("b's signed entry: %v", err)
	}
	tm, _ := rdb.Time(ctx).Result()
	now := tm.UnixMicro()
	for i := range 50 {
		rdb.ZAdd(ctx, "sketchproxy:members", redis.Z{Score: float64(tm.UnixMilli()), Member: fmt.Sprint("ghost-", i)})
		rdb.HSet(ctx, signed, fmt.Sprint("ghost-", i), fmt.Sprintf("%d %s", now, strings.Repeat("0", 32)))
	}
	rdb.HSet(ctx, signed, "copy-of-b", old) // b's genuine entry under another id
	before := a.rejected.Load()
	if !a.send(nil, true) {
		t.Fatal("the heartbeat failed")
	}
	if n := a.n.Load(); n != 2 {
		t.Errorf("with 50 made-up members and a copied entry, a replica counts %d replicas, want 2", n)
	}
	if got := a.rejected.Load() - before; got != 51 {
		t.Errorf("%d members rejected, want 51", got)
	}
	// b's genuine entry, replayed once it is out of the window, is not
	// b alive: b has stopped, and a counts itself alone once the floor of
	// the most seen lately has passed.
	hb := a.heartbeat(time.Now(), 3*500*time.Millisecond+time.Second)
	rdb.HSet(ctx, signed, b.self, old)
	br := &beatReply{now: now + (hb.window + time.Second).Microseconds()}
	w := strings.Fields(old)
	ts, _ := strconv.ParseInt(w[0], 10, 64)
	br.members = []memberEntry{{id: b.self, ts: ts, mac: w[1]}, {id: a.self, ts: hb.ts, mac: hb.mac}}
	if n := a.countMembers(hb, br); n != 1 {
		t.Errorf("b's entry replayed past the window counts: %d replicas, want 1", n)
	}
	br.now = now
	if n := a.countMembers(hb, br); n != 2 {
		t.Errorf("b's entry within the window counts %d replicas, want 2", n)
	}
}

// A claim made up of genuine records may repeat one: its replica counts
// once, at its latest record.
func TestFleetClaimRepeatingARecord(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	f := hostileFleet(t, newMemStore(clk.Now), clk.Now, 2)
	e := hostileEntry(f, "client", 20, 2)
	if !f.send([]*hotEntry{e}, false) {
		t.Fatal("the round failed")
	}
	v := e.view.Load()
	r1 := signedRec{id: "r1", c: 6, d: 6, at: v.tick, ts: v.at + 1}
	later := r1
	later.c, later.ts = 8, v.at+2
	f.hear(signedClaim(f, e.rkey, v.tick, v.at, v.at+2, r1, later, r1))
	if v := e.view.Load(); len(v.others) != 1 || v.others[0].c != 8 {
		t.Fatalf("a claim repeating r1's record reads %+v, want r1 once, at its latest count 8", v.others)
	}
}

// The heartbeats are published on the members' channel too: a replica
// whose heartbeat reads a members' hash flushed since the others beat
// still counts them, from what it heard. Anyone allowed to PUBLISH there
// can send a heartbeat, but none made up verifies (counted rejected), and
// a genuine one replayed past the window is not a replica alive.
func TestFleetBeatsHeardOnRedis(t *testing.T) {
	addr := testkit.RedisServer(t)
	var fs [2]*Fleet
	for i := range fs {
		rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
		t.Cleanup(rs.close)
		f := hostileFleet(t, rs, time.Now, 0)
		f.self = fmt.Sprint("r", i)
		ready := make(chan struct{}, 2)
		go rs.listen(f.channel(), f.hear, func() { ready <- struct{}{} }, func(error) {})
		go rs.listen(f.beatChannel(), f.hearBeat, func() { ready <- struct{}{} }, func(error) {})
		<-ready
		<-ready
		fs[i] = f
	}
	a, b := fs[0], fs[1]
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	heard := func(f *Fleet, id string) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			f.bmu.Lock()
			_, ok := f.beatsHeard[id]
			f.bmu.Unlock()
			if ok {
				return true
			}
		}
		return false
	}
	if !b.send(nil, true) || !a.send(nil, true) {
		t.Fatal("a heartbeat failed")
	}
	if !heard(b, "r0") {
		t.Fatal("b never heard a's heartbeat on the members' channel")
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rejected := b.rejected.Load()
	if !b.send(nil, true) {
		t.Fatal("the heartbeat failed")
	}
	if n := b.n.Load(); n != 2 {
		t.Errorf("after FLUSHALL, b's heartbeat counts %d replicas, want 2 (a's heartbeat heard)", n)
	}
	// Made up: a ghost with any MAC, a line that is not a heartbeat, and a's
	// genuine entry under another id.
	b.bmu.Lock()
	clear(b.beatsHeard)
	b.bmu.Unlock()
	hb := a.heartbeat(time.Now(), time.Second)
	for _, p := range []string{"ghost " + strconv.FormatInt(hb.ts, 10) + " " + strings.Repeat("0", 32), "not a heartbeat at all", "copy-of-a " + hb.entry()} {
		rdb.Publish(ctx, b.beatChannel(), p)
	}
	rdb.Publish(ctx, b.beatChannel(), "r0 "+hb.entry()) // genuine, to know the others arrived
	if !heard(b, "r0") {
		t.Fatal("b never heard a's heartbeat published")
	}
	b.bmu.Lock()
	n := len(b.beatsHeard)
	b.bmu.Unlock()
	if n != 1 {
		t.Errorf("b keeps %d heartbeats heard, want 1 (a's): one made up was believed", n)
	}
	if got := b.rejected.Load() - rejected; got != 3 {
		t.Errorf("%d heartbeats rejected, want 3", got)
	}
	// a's heartbeat, replayed once out of the window, is not a alive.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	late := &beatReply{now: hb.ts + (2 * time.Second).Microseconds()}
	bhb := b.heartbeat(time.Now(), time.Second)
	if n := b.countMembers(bhb, late); n != 1 {
		t.Errorf("a's heartbeat heard, replayed past the window, counts: %d replicas, want 1", n)
	}
	// a's leave, published at its close, ends its count at once: a
	// replica restarted under a new name was otherwise counted twice
	// until the old one's heartbeat left the window. A leave made up (a's
	// heartbeat's MAC, which signs no leave) is rejected.
	hb = a.heartbeat(time.Now(), time.Second)
	rdb.Publish(ctx, b.beatChannel(), "r0 "+hb.entry())
	rdb.Publish(ctx, b.beatChannel(), "r0 "+hb.entry()+" left")
	if !a.send(nil, true) || !b.send(nil, true) || b.n.Load() != 2 {
		t.Fatalf("b counts %d replicas beside a, want 2", b.n.Load())
	}
	lhb := a.heartbeat(time.Now(), 0)
	a.signLeave(lhb)
	if err := a.store.leave(ctx, lhb); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b.bmu.Lock()
		left := b.beatsHeard["r0"].left
		b.bmu.Unlock()
		if left {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never heard a's leave")
		}
	}
	if !b.send(nil, true) {
		t.Fatal("the heartbeat failed")
	}
	if n := b.n.Load(); n != 1 {
		t.Errorf("after a left, b counts %d replicas, want 1", n)
	}
}

// Heartbeats heard are dated: one signed ahead of Redis's clock (a
// replica's first, on its own clock ahead, before any reply) held off
// every later one of its replica for as long as it was ahead, and old
// genuine ones filled beatsHeldMax (a review's tests). One out of the
// window of this replica's reckoning is rejected; one kept from before
// any reply and found ahead at a count is dropped. A leave ends its
// replica's count whatever its date (one dated before its last
// heartbeat, the reckoning moved back by a failover, was ignored; one
// out of the window was rejected in a review).
func TestFleetBeatsHeardDated(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	st := newMemStore(clk.Now)
	a, b := hostileFleet(t, st, clk.Now, 0), hostileFleet(t, st, clk.Now, 0)
	a.self, b.self = "a", "b"
	beat := func(ts int64, left bool) string {
		r := &signedRec{id: "a", ts: ts}
		if left {
			r.c = 1
		}
		p := fmt.Sprintf("a %d %s", ts, a.macOf(a.signedMembers(), r))
		if left {
			p += " left"
		}
		return p
	}
	count := func() int64 {
		hb := b.heartbeat(clk.Now(), b.beatWindow())
		return b.countMembers(hb, &beatReply{now: clk.Now().UnixMicro()})
	}
	now := clk.Now().UnixMicro()
	// Before b's first reply: a heartbeat 20 s ahead is kept, then dropped
	// at the count, and the next one, dated right, counts.
	b.hearBeat(beat(now+20_000_000, false))
	if n := count(); n != 1 {
		t.Errorf("a heartbeat 20 s ahead counts: %d replicas, want 1", n)
	}
	b.hearBeat(beat(now, false))
	if n := count(); n != 2 {
		t.Errorf("after a heartbeat dated ahead, one dated right counts %d replicas, want 2", n)
	}
	// Once b has a reply: one ahead, or from before the window, is
	// rejected and kept nowhere.
	b.noteRedisTime(now)
	rejected := b.rejected.Load()
	b.hearBeat(beat(now+20_000_000, false))
	b.hearBeat(beat(now-int64(b.beatWindow()/time.Microsecond)-1, false))
	if got := b.rejected.Load() - rejected; got != 2 {
		t.Errorf("%d of a heartbeat ahead and one from before the window rejected, want 2", got)
	}
	b.bmu.Lock()
	kept := b.beatsHeard["a"].ts
	b.bmu.Unlock()
	if kept != now {
		t.Errorf("b keeps a's heartbeat of %d, want %d (the one dated right)", kept, now)
	}
	// A leave dated before a's last heartbeat, even out of the window,
	// ends a's count, and is no record rejected.
	rejected = b.rejected.Load()
	b.hearBeat(beat(now-3_000_000, true))
	if n := count(); n != 1 {
		t.Errorf("after a's leave, dated 3 s before its last heartbeat: %d replicas, want 1", n)
	}
	if got := b.rejected.Load() - rejected; got != 0 {
		t.Errorf("a's genuine leave counted %d rejected", got)
	}
	b.hearBeat(beat(now, false)) // its last heartbeat, heard again
	if n := count(); n != 1 {
		t.Errorf("a's last heartbeat heard after its leave counts: %d replicas, want 1", n)
	}
}

// An ACL that grants the claims' channel alone refuses a SUBSCRIBE of
// both channels: the heartbeats are heard apart, so the claims still are
// (and the heartbeats' loss is warned), and a leave whose PUBLISH the ACL
// refuses still leaves the hash without an error. A members' key of
// another type fails the heartbeat's script, but after its PUBLISH: the
// others still hear it and count its replica.
func TestFleetBeatsChannelRefused(t *testing.T) {
	addr := testkit.RedisServer(t)
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "claimsonly", "on", ">pw-0123456789", "~sketchproxy:*", "resetchannels", "&sketchproxy:claims", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}, Username: "claimsonly", Password: "pw-0123456789"})
	f := hostileFleet(t, rs, time.Now, 0)
	f.self = "c"
	var logged strings.Builder
	var mu sync.Mutex
	f.log = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), nil))
	f.Start()
	defer f.Close()
	for deadline := time.Now().Add(5 * time.Second); !f.hearing.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the claims' channel alone granted: not hearing the claims")
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		warned := strings.Contains(logged.String(), "not hearing the other replicas' heartbeats")
		mu.Unlock()
		if warned {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the heartbeats' channel refused: not warned")
		}
	}
	hb := f.heartbeat(time.Now(), 0)
	f.signLeave(hb)
	if err := rs.leave(ctx, hb); err != nil {
		t.Errorf("a leave whose PUBLISH the ACL refuses: %v, want no error", err)
	}

	// The members' key of another type: a's script fails after its PUBLISH.
	var fs [2]*Fleet
	for i := range fs {
		s := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
		t.Cleanup(s.close)
		fs[i] = hostileFleet(t, s, time.Now, 0)
		fs[i].self = fmt.Sprint("w", i)
		ready := make(chan struct{}, 1)
		go s.listen(fs[i].beatChannel(), fs[i].hearBeat, func() { ready <- struct{}{} }, func(error) {})
		<-ready
	}
	if err := admin.Set(ctx, "sketchproxy:members", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	fs[0].send(nil, true)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fs[1].bmu.Lock()
		_, ok := fs[1].beatsHeard["w0"]
		fs[1].bmu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the members' key of another type: w0's heartbeat never heard")
		}
	}
	fs[1].send(nil, true)
	if n := fs[1].n.Load(); n != 2 {
		t.Errorf("the members' key of another type: w1 counts %d replicas, want 2 (w0 heard)", n)
	}
}

type writerFunc func([]byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }
