package fleet

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// The index of heavy keys on a real redis-server: bits set by one round
// are read back by a replica in its warm-up, as memStore answers; and
// whatever sits under its keys (a string of 16 MB, a hash of 200,000
// fields, an ACL without SETBIT and GETRANGE), a round with the fleet's
// timeout still syncs its hot keys, and reads at most indexBits/8 bytes
// of each bitmap. A first build kept the tags in a hash read whole: a
// million fields under it made every round pass the timeout (a review).
func TestHotIndexOnRedis(t *testing.T) {
	addr := testkit.RedisServer(t)
	opts := &redis.UniversalOptions{Addrs: []string{addr}, DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond, MaxRetries: -1}
	rs := newRedisStore(opts)
	defer rs.close()
	mem := newMemStore(time.Now)
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	const stale = 1400 * time.Millisecond
	call := shareCall{rkey: "sketchproxy:{t1}k:abc", marker: "sketchproxy:{t1}run", tick: time.Second, c: 2, d: 2, at: time.Now().Unix()}
	index := func(cur, prev string, read bool, add ...uint32) *hotIndex {
		return &hotIndex{keys: [2]string{cur, prev}, ttl: 3 * stale, read: read, add: add}
	}
	// round sends one hot key's call and x within the fleet's timeout.
	round := func(st fleetStore, x *hotIndex) (answered bool, err error) {
		tctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		defer cancel()
		r := &shareRound{id: "r0", candidate: "run", stale: stale, ttl: time.Minute, index: x}
		rp, _, _, err := st.sync(tctx, r, []shareCall{call}, nil)
		return len(rp) == 1 && rp[0].ok, err
	}
	isSet := func(bits []byte, b uint32) bool { return len(bits) > int(b>>3) && bits[b>>3]&(0x80>>(b&7)) != 0 }

	// Set by one round, read by the next, as in memory.
	const cur, prev = "sketchproxy:{sketchproxy:hot}:11", "sketchproxy:{sketchproxy:hot}:10"
	marks := []uint32{0, 7, 8, 4242, indexBits - 1}
	for _, st := range []fleetStore{rs, mem} {
		if _, err := round(st, index(prev, "sketchproxy:{sketchproxy:hot}:9", false, marks[:2]...)); err != nil {
			t.Fatal(err)
		}
		if _, err := round(st, index(cur, prev, false, marks[2:]...)); err != nil {
			t.Fatal(err)
		}
		x := index(cur, prev, true)
		if ok, err := round(st, x); err != nil || !ok || !x.ok {
			t.Fatalf("%T: the index read: round answered %v, err %v, index ok %v", st, ok, err, x.ok)
		}
		set := 0
		for b := range uint32(indexBits) {
			if isSet(x.bits, b) {
				set++
			}
		}
		for _, b := range marks {
			if !isSet(x.bits, b) {
				t.Errorf("%T: bit %d set by a round, not read back", st, b)
			}
		}
		if set != len(marks) || len(x.bits) != indexBits/8 {
			t.Errorf("%T: %d bits set in %d bytes read, want %d in %d", st, set, len(x.bits), len(marks), indexBits/8)
		}
	}

	// A string of 16 MB under this generation's bitmap: one read of
	// indexBits/8 bytes, the round on time.
	const stuffed, other = "sketchproxy:{sketchproxy:hot}:21", "sketchproxy:{sketchproxy:hot}:20"
	if err := admin.Set(ctx, stuffed, strings.Repeat("\xff", 16<<20), 0).Err(); err != nil {
		t.Fatal(err)
	}
	x := index(stuffed, other, true, 99)
	if ok, err := round(rs, x); err != nil || !ok || !x.ok || len(x.bits) != indexBits/8 {
		t.Fatalf("a 16 MB string under the index: round answered %v, err %v, index ok %v, %d bytes read", ok, err, x.ok, len(x.bits))
	}
	// A hash of 200,000 fields under the generation before: the index
	// fails (WRONGTYPE), the round does not.
	for i := 0; i < 200_000; i += 10_000 {
		args := make([]any, 0, 20_000)
		for j := i; j < i+10_000; j++ {
			args = append(args, j, "1")
		}
		if err := admin.HSet(ctx, other, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	x = index(stuffed, other, true)
	if ok, err := round(rs, x); err != nil || !ok || x.ok {
		t.Fatalf("a hash of 200,000 fields under the index: round answered %v, err %v, index ok %v (want the round good and the index not)", ok, err, x.ok)
	}

	// An ACL without SETBIT and GETRANGE (the one documented before the
	// index): the index is refused, the round is not.
	acl := strings.Fields("on >index-pw-0123 ~sketchproxy:* resetchannels &sketchproxy:* -@all +evalsha +eval +script|load +set +get +zadd +zremrangebyscore +zcard +pexpire +ping +hgetall +hset +hdel +time +publish +subscribe")
	if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", "fleet"}, anySlice(acl)...)...).Err(); err != nil {
		t.Fatal(err)
	}
	old := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}, Username: "fleet", Password: "index-pw-0123", DialTimeout: 250 * time.Millisecond, ReadTimeout: 250 * time.Millisecond, WriteTimeout: 250 * time.Millisecond, MaxRetries: -1})
	defer old.close()
	x = index(cur, prev, true, 5)
	if ok, err := round(old, x); err != nil || !ok || x.ok {
		t.Fatalf("an ACL without SETBIT and GETRANGE: round answered %v, err %v, index ok %v (want the round good and the index not)", ok, err, x.ok)
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// An index Redis refuses (here as an ACL without its commands would) is
// warned once, with what it costs, and not sent again in its generation;
// the round is good.
func TestHotIndexRefusedWarned(t *testing.T) {
	var logs strings.Builder
	clk := time.Unix(1_700_000_000, 0)
	mem := newMemStore(func() time.Time { return clk })
	mem.noIndex = true
	f := hostileFleet(t, mem, func() time.Time { return clk }, 0)
	f.log = slog.New(slog.NewTextHandler(&logs, nil))
	e := hostileEntry(f, "heavy", 40, 30)
	e.view.Store(&shareView{tick: clk.Unix()}) // its view: 30 of 40 here, heavy
	for range 3 {
		if !f.round() {
			t.Fatal("a round whose index Redis refused failed")
		}
		clk = clk.Add(500 * time.Millisecond)
	}
	if n := strings.Count(logs.String(), "refused the index of heavy keys"); n != 1 {
		t.Errorf("the refused index warned %d times, want once:\n%s", n, logs.String())
	}
	if got := f.indexRefused.Load(); got == 0 {
		t.Error("the refused generation is not kept: every round sends the index again")
	}
	if op := f.indexOp([]*hotEntry{e}, clk); op != nil && len(op.add) > 0 {
		t.Errorf("after the index was refused, the next round sends %d bits again in its generation", len(op.add))
	}
}

// A request of a replica's warm-up asks the index at the cost of one
// HMAC and no allocation, and finds the bit keySum gives the key.
func TestIndexedNoAlloc(t *testing.T) {
	clk := time.Unix(1_700_000_000, 0)
	f := hostileFleet(t, newMemStore(func() time.Time { return clk }), func() time.Time { return clk }, 0)
	bm := make([]byte, indexBits/8)
	skey := []byte("api\x00rate\x00192.0.2.1")
	sum := f.keySum(skey, time.Second, 40)
	b := indexBit(sum[:])
	bm[b>>3] |= 0x80 >> (b & 7)
	f.heavyBits.Store(&bm)
	if !f.indexed(skey, time.Second, 40) {
		t.Fatal("a key whose bit is set reads as not marked")
	}
	if f.indexed(skey, time.Second, 42) || f.indexed([]byte("api\x00rate\x00192.0.2.2"), time.Second, 40) {
		t.Error("another key (or the same key under another limit) reads as marked")
	}
	if raceOn {
		return // the race detector drops pooled items at random
	}
	if a := testing.AllocsPerRun(100, func() { f.indexed(skey, time.Second, 40) }); a != 0 {
		t.Errorf("indexed allocates %v times a call, want 0", a)
	}
}

// The warm-up runs from a replica's first answer from Redis to stale()
// past its first request, however late that comes (a readiness delay, a
// balancer's slow start): the index of heavy keys then still holds a key
// the fleet holds at its limit. Idle, a replica reads the bitmaps every
// stale(), not every round; in its warm-up, every round; after it, never.
func TestFleetSimWarmUpFromFirstRequest(t *testing.T) {
	s := newTickSim(t) // the run below keeps to the tick
	for i := range 60 {
		s.decide(i%3, "held")
	}
	s.run(s.clk.Now().Add(s.fleets[0].stale())) // the rounds mark it heavy; the others' warm-ups end
	s.restart(0, "r0.1")
	reads := s.store.indexReads
	idle := 20 * time.Second
	s.run(s.clk.Now().Add(idle))
	idleReads := s.store.indexReads - reads
	stale := s.fleets[0].stale()
	if most := int(idle/stale) + 2; idleReads > most || idleReads == 0 {
		t.Errorf("idle for %v, the restarted replica read the index %d times, want 1 to %d (every %v)", idle, idleReads, most, stale)
	}
	admitted := s.admits(0, "held", 10)
	if admitted > 0 {
		t.Errorf("the restarted replica, its first request %v after its start, admitted %d of a key the fleet holds at its limit", idle, admitted)
	}
	reads = s.store.indexReads
	s.run(s.clk.Now().Add(stale))
	warm := s.store.indexReads - reads
	reads = s.store.indexReads
	s.run(s.clk.Now().Add(10 * time.Second))
	t.Logf("index reads: %d idle in %v, %d in the warm-up's %v, %d in 10 s after it; %d of 10 admitted", idleReads, idle, warm, stale, s.store.indexReads-reads, admitted)
	if want := int(stale / (500 * time.Millisecond)); warm < want-1 {
		t.Errorf("%d index reads in the warm-up's %v, want about %d (every round)", warm, stale, want)
	}
	if n := s.store.indexReads - reads; n > 0 {
		t.Errorf("%d index reads after the warm-up", n)
	}
}

// The index is unsigned: a writer without the secret may set every bit.
// In a restarted replica's warm-up each mouse's first request then joins
// the hot set (and claims), and once the set was full every key past its
// promotion point was decided alone at θ/N: a key the others held at its
// limit got θ/N more there, and a sticky client under its limit was held
// to θ/N (26 of 20, and 6 of 10, in a review through Redis). The index
// promotes only while the set is under half of max_hot: the mice take
// half at most, and a key held at its limit then joins at the warm-up's
// third request, as where the index is refused (2 more at most).
func TestFleetSimForgedIndexLeavesRoom(t *testing.T) {
	s := newTickSim(t)
	held := 0
	for i := range 60 {
		if s.decide(i%3, "held") {
			held++
		}
	}
	s.run(s.clk.Now().Add(s.fleets[0].stale()))
	gen := s.clk.Now().UnixMicro() / indexGeneration.Microseconds()
	for g := gen - 1; g <= gen+1; g++ {
		s.store.hot[s.fleets[0].indexKey(g)] = &memHot{bits: bytes.Repeat([]byte{0xff}, indexBits/8), expires: s.clk.Now().Add(time.Hour)}
	}
	const maxHot = 20
	s.fleets[0].cfg.MaxHot = maxHot
	s.restart(0, "r0.1")
	for i := range 3 * maxHot {
		s.decide(0, fmt.Sprint("mouse-", i))
	}
	f := s.fleets[0]
	hot := f.count.Load()
	more, light := s.admits(0, "held", 10), s.admits(0, "fresh", 8)
	t.Logf("every bit of the index set: %d one-off keys made %d hot of max_hot %d; the fleet held the key at %d of a burst of 20, the restarted replica admitted %d more of 10; a client under its limit got %d of 8 there", 3*maxHot, hot, maxHot, held, more, light)
	if held != 20 {
		t.Fatalf("the fleet admitted %d of 60 before the restart, want the burst of 20", held)
	}
	if hot > maxHot/2 {
		t.Errorf("a forged index made %d one-off keys hot, past half of max_hot (%d)", hot, maxHot/2)
	}
	if more > 2 {
		t.Errorf("with a forged index the restarted replica admitted %d more of a key held at its limit, want 2 at most (as with the index refused)", more)
	}
	if light != 8 {
		t.Errorf("a client under its limit got %d of 8 requests through on the restarted replica", light)
	}
	// Keys past the promotion point fill the set: warned once.
	var logs strings.Builder
	f.log = slog.New(slog.NewTextHandler(&logs, nil))
	for i := range maxHot {
		for range 4 {
			s.decide(0, fmt.Sprint("busy-", i))
		}
	}
	if full := f.hotFull.Load(); full == 0 || strings.Count(logs.String(), "the hot set is full") != 1 {
		t.Errorf("%d requests found the hot set full; warned %d times, want once:\n%s", full, strings.Count(logs.String(), "the hot set is full"), logs.String())
	}
}

// Past half of max_hot the index makes no key hot, but a key it made hot
// stays shared from every request: before, its second request, its first
// refused (a count below a quarter of the warm-up's point), was decided
// as a mouse and got in, one more of each key held at its limit (a
// review, max_hot 7 and 3 keys). Keys past the half join at the warm-up's
// third request, as where the index is refused: 2 more at most.
func TestFleetSimIndexPastHalfHot(t *testing.T) {
	for _, c := range []struct{ maxHot, keys int }{{7, 3}, {6, 5}, {8, 5}} {
		s := newTickSim(t)
		for k := range c.keys {
			held := 0
			for i := range 3 {
				held += s.admits(i, fmt.Sprint("held", k), 20)
			}
			if held != 20 {
				t.Fatalf("key %d: the fleet admitted %d of 60, want the burst of 20", k, held)
			}
		}
		s.run(s.clk.Now().Add(s.fleets[0].stale()))
		s.fleets[0].cfg.MaxHot = c.maxHot
		s.restart(0, "r0.1")
		more := make([]int, c.keys)
		for range 10 {
			for k := range c.keys {
				more[k] += s.admits(0, fmt.Sprint("held", k), 1)
			}
		}
		t.Logf("max_hot %d, %d keys held at their limit: the restarted replica admitted %v more", c.maxHot, c.keys, more)
		for k, m := range more {
			if want := 0; k >= c.maxHot/2 {
				want = 2
				if m > want {
					t.Errorf("max_hot %d: key %d, past half of it, got %d more, want %d at most", c.maxHot, k, m, want)
				}
			} else if m != want {
				t.Errorf("max_hot %d: key %d, made hot by the index, got %d more, want 0", c.maxHot, k, m)
			}
		}
	}
}

// Redis restarted empty (or flushed) loses the index of heavy keys with
// the records. Each key was marked once a generation, so the index
// stayed empty for up to a minute, and a replica restarted meanwhile
// added 2 of a key held at its limit (22 of 20 in a review, and through
// Caddy). The replicas that find Redis empty mark their heavy keys again
// at their next round: the restart adds nothing.
func TestFleetSimIndexAfterRedisEmpty(t *testing.T) {
	s := newTickSim(t)
	held := 0
	for i := range 3 {
		held += s.admits(i, "held", 20)
	}
	s.run(s.clk.Now().Add(s.fleets[0].stale()))
	s.store.flush()
	s.run(s.clk.Now().Add(1500 * time.Millisecond)) // the others' rounds find it empty
	marked := 0
	for _, h := range s.store.hot {
		for _, b := range h.bits {
			for ; b != 0; b &= b - 1 {
				marked++
			}
		}
	}
	s.restart(0, "r0.1")
	more := s.admits(0, "held", 10)
	t.Logf("the fleet held the key at %d of a burst of 20; Redis emptied, %d bits marked again 1.5 s later; a replica restarted then admitted %d more of 10", held, marked, more)
	if held != 20 {
		t.Fatalf("the fleet admitted %d of 60 before, want the burst of 20", held)
	}
	if marked == 0 {
		t.Error("the index of heavy keys is empty 1.5 s after Redis lost it: no replica marked its heavy keys again")
	}
	if more > 0 {
		t.Errorf("a replica restarted after Redis lost its data admitted %d more of a key held at its limit", more)
	}
}

// A replica restarted without a state_file, and then Redis lost its data
// (flushed, or restarted empty): what the replica's previous self had
// admitted was only in Redis, and the restarted replica took it again
// (27 of 20 through a real redis-server, in a review). The replicas that
// find Redis empty write back the others' records they last read (signed
// by their writers, dated at their ticks): the restart adds nothing.
func TestFleetSimRestoredAfterRedisEmpty(t *testing.T) {
	s := newTickSim(t)
	held, first := 0, 0
	for i := range 60 {
		a := s.admits(i%3, "held", 1)
		held += a
		if i%3 == 0 {
			first += a
		}
	}
	s.run(s.clk.Now().Add(time.Second))
	s.restart(0, "r0.1")
	s.run(s.clk.Now().Add(200 * time.Millisecond))
	s.store.flush()
	s.run(s.clk.Now().Add(time.Second)) // the others' rounds find Redis empty
	more := s.admits(0, "held", 10)
	t.Logf("the fleet held the key at %d of a burst of 20 (%d on replica 0); replica 0 restarted, Redis emptied: %d more of 10 there", held, first, more)
	if held != 20 || first == 0 {
		t.Fatalf("the fleet admitted %d of 60 (%d on replica 0), want the burst of 20 and some on replica 0", held, first)
	}
	if more > 0 {
		t.Errorf("replica 0, restarted without a state_file before Redis lost its data, admitted %d more of a key held at its limit", more)
	}
}

// newTickSim is a fleet sim of 3 replicas at 20 a minute (a 30 s tick),
// 2.1 s into a tick of the limit.
func newTickSim(t *testing.T) *fleetSim {
	s := newFleetSim(t, 3, rate.Rate{Requests: 20, Per: time.Minute}, 3)
	const tick = 30 * time.Second
	s.run(s.clk.Now().Truncate(tick).Add(tick + 100*time.Millisecond))
	s.run(s.clk.Now().Add(2 * time.Second))
	return s
}

// Anyone who may write under the prefix can change a tag's run marker
// (SET <prefix>{tN}run x), which a replica reads as Redis having lost the
// tag's records: each change had it send every hot key of the tag again
// at once, with the others' records to write back (20 sends for 20
// changes in a review). Now once an interval per tag at most.
func TestFleetRestoreOnceAnInterval(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	store := newMemStore(clk.Now)
	var fs []*Fleet
	var es []*hotEntry
	for i := range 3 {
		f := hostileFleet(t, store, clk.Now, 3)
		f.self = fmt.Sprint("r", i)
		fs, es = append(fs, f), append(es, hostileEntry(f, "client", 20, 4))
	}
	for range 2 {
		for i, f := range fs {
			f.send(es[i:i+1], false)
			clk.Advance(10 * time.Millisecond)
		}
	}
	extra := 0
	for n := range 20 { // 20 changes in 200 ms
		store.mu.Lock()
		store.markers[es[0].marker] = fmt.Sprint("attacker-", n)
		store.mu.Unlock()
		fs[0].send(es[:1], false)
		if es[0].pending.Load() {
			extra++
			fs[0].sendPending()
		}
		clk.Advance(10 * time.Millisecond)
	}
	t.Logf("20 changes of the run marker in 200 ms: %d sends at once (the interval: 500 ms)", extra)
	if extra != 1 {
		t.Errorf("20 changes of the run marker in 200 ms made %d sends at once, want 1", extra)
	}
}
