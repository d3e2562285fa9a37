package fleet

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// shareScript and memStore answer the same calls alike: the records kept
// as signed, dropped (halved to nothing: counts from their tick, demands
// from the tick after, a demand unwritten for stale given back), the run
// marker, and the claim published, read back through the subscription.
// What a reader believes of them (fleet.peersOf) is the same for both.
// A conditional claim is written where it fits beside what the others
// hold (their counts, or guarantees where more), and else the count
// without it.
func TestShareScriptMatchesMemory(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	defer rs.close()
	mem := newMemStore(time.Now)
	heard := make(chan string, 16)
	go rs.listen("sketchproxy:claims", func(p string) { heard <- p }, func() {}, func(error) {})
	const tick = time.Hour // the two clocks agree on the tick
	tk := time.Now().UnixNano() / int64(tick)
	f := hostileFleet(t, mem, time.Now, 0)
	f.redisAt.Store(time.Now().UnixMicro()) // its records dated on Redis's clock
	f.redisSeen.Store(time.Now().UnixNano())
	call := func(c, d, g uint32, at int64, publish bool) shareCall {
		return shareCall{rkey: "sketchproxy:{t1}k:abc", marker: "sketchproxy:{t1}run", tick: tick, c: c, d: d, g: g, at: at, publish: publish}
	}
	edge := func(c, d, g uint32, at int64) shareCall {
		e := call(c, d, g, at, true)
		e.rkey = "sketchproxy:{t1}k:edge"
		return e
	}
	claimed := func(c shareCall, c1, limit uint32) shareCall {
		c.c1, c.limit = c1, limit
		return c
	}
	round := func(id string, stale time.Duration) *shareRound {
		return &shareRound{id: id, candidate: "run-1", channel: "sketchproxy:claims", stale: stale, ttl: time.Minute}
	}
	steps := []struct {
		id    string
		stale time.Duration
		call  shareCall
	}{
		{"r0", time.Hour, call(40, 80, 12, tk, false)},
		{"r1", time.Hour, call(64, 100, 10, tk-3, false)}, // written 3 ticks ago: 64>>3, demand 100>>2
		{"r2", time.Hour, call(0, 0, 0, tk, false)},       // nothing: dropped by the next call
		{"r0", time.Hour, call(42, 90, 14, tk, true)},
		{"r3", time.Microsecond, call(6, 6, 2, tk, false)}, // the others unwritten for more than stale: counts only
		// r1 claims 20 beside r0's 42 (guarantee 14) and r3's 6: 68 of a
		// limit of 80 fits; 33 (81) does not, and 8 is written.
		{"r1", time.Hour, claimed(call(8, 100, 10, tk, true), 20, 80)},
		{"r1", time.Hour, claimed(call(8, 100, 10, tk, true), 33, 80)},
		// r2's guarantee of 40 holds room its count (0) does not: 42 +
		// 10 (r1's guarantee) + 40 + 10 = 102 of a limit of 102 fits, 12
		// does not.
		{"r2", time.Hour, call(0, 1, 40, tk, false)},
		{"r3", time.Hour, claimed(call(6, 6, 2, tk, true), 10, 102)},
		{"r3", time.Hour, claimed(call(6, 6, 2, tk, true), 12, 102)},
		// A claim dated a tick before Redis's (its request decided just
		// before the tick ended) is judged at its own tick: r0's 40 then,
		// 20 at Redis's. 20 beside 40 fits a limit of 60; 24 does not,
		// where judged at Redis's tick it did (20 + 24 halved once).
		{"r0", time.Hour, edge(40, 80, 0, tk-1)},
		{"r1", time.Hour, claimed(edge(0, 2, 0, tk-1), 24, 60)},
		{"r1", time.Hour, claimed(edge(0, 2, 0, tk-1), 20, 60)},
	}
	for i, st := range steps {
		// The subscription is up before the first claim is published.
		if i == 3 {
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				n, _ := rs.rdb.PubSubNumSub(context.Background(), "sketchproxy:claims").Result()
				if n["sketchproxy:claims"] > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no subscriber on the claims channel")
				}
			}
		}
		f.self = st.id
		calls := []shareCall{st.call}
		f.sign(calls) // as this replica's send does
		got, _, _, err := rs.sync(context.Background(), round(st.id, st.stale), calls, nil)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want, _, _, _ := mem.sync(context.Background(), round(st.id, st.stale), calls, nil)
		if g, w := describe(got[0]), describe(want[0]); g != w {
			t.Errorf("step %d (%s): Redis answered %s, memory %s", i, st.id, g, w)
		}
		if c1 := st.call.c1; c1 > 0 {
			t.Logf("step %d: %s claims %d of a limit of %d: written %v", i, st.id, c1, st.call.limit, got[0].wrote(st.id, c1))
			if fits := c1 != 33 && c1 != 12 && c1 != 24; got[0].wrote(st.id, c1) != fits {
				t.Errorf("step %d: %s's claim of %d written: %v, want %v (%s)", i, st.id, c1, got[0].wrote(st.id, c1), fits, describe(got[0]))
			}
		}
		for _, r := range got[0].recs {
			if !f.verify(st.call.rkey, &r) {
				t.Errorf("step %d: %s's record %s does not verify", i, r.id, r.String())
			}
		}
		if st.id == "r3" {
			later := got[0]
			later.now += int64(f.stale()/time.Microsecond) + 1
			peers, _ := f.peersOf(st.call.rkey, &later, nil)
			for _, p := range peers {
				if p.id == "r0" && (p.c != 42 || p.d != 0 || p.g != 0) {
					t.Errorf("r0 signed more than stale ago reads %+v, want its count 42 kept, its demand and guarantee given back", p)
				}
			}
		}
		if st.call.publish {
			select {
			case p := <-heard:
				rkey, rp, ok := parseClaim(p)
				rp.run = got[0].run // a claim carries no marker
				if !ok || rkey != st.call.rkey || describe(rp) != describe(got[0]) {
					t.Errorf("claim heard %q: %s, want %s", p, describe(rp), describe(got[0]))
				}
			case <-time.After(5 * time.Second):
				t.Error("no claim heard")
			}
		}
	}
}

// describe is a reply's content in a stable order (Redis returns the
// records in its hash's order).
func describe(r shareReply) string {
	var ps []string
	for _, p := range r.recs {
		ps = append(ps, fmt.Sprintf("%s:%s", p.id, p.String()))
	}
	slices.Sort(ps)
	return "ok=" + strconv.FormatBool(r.ok) + " tick=" + strconv.FormatInt(r.tick, 10) + " run=" + r.run + " " + strings.Join(ps, " ")
}

// A Redis without the scripts (new, restarted or failed over: SCRIPT
// FLUSH here) costs a round no error: the round is sent again as EVAL,
// which caches them, heartbeat included, and the next round's EVALSHA
// finds them.
func TestSyncWithoutScriptsCached(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	defer rs.close()
	const tick = time.Hour
	tk := time.Now().UnixNano() / int64(tick)
	call := shareCall{rkey: "sketchproxy:{t1}k:abc", marker: "sketchproxy:{t1}run", tick: tick, c: 40, d: 80, g: 12, at: tk}
	round := &shareRound{id: "r0", candidate: "run-1", channel: "sketchproxy:claims", stale: time.Hour, ttl: time.Minute}
	ctx := context.Background()
	for i := range 3 {
		if i < 2 {
			if err := rs.rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		hb := &heartbeat{key: "sketchproxy:replicas", signedKey: "sketchproxy:{sketchproxy:replicas}:signed", id: "r0", now: time.Now(), window: time.Minute, ts: time.Now().UnixMicro(), mac: "m"}
		got, members, sent, err := rs.sync(ctx, round, []shareCall{call}, hb)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if !got[0].ok || members == nil || len(members.members) != 1 || members.members[0].id != "r0" {
			t.Fatalf("round %d: reply %s, members %+v: want a record and r0's entry", i, describe(got[0]), members)
		}
		// EVALSHA twice, then EVAL twice where the scripts were flushed.
		if want := map[bool]int{true: 4, false: 2}[i < 2]; sent != want {
			t.Errorf("round %d: %d commands sent, want %d", i, sent, want)
		}
	}
}

// Records written back where Redis lost them (Fleet.restoreLost): the
// script writes each only where Redis holds none of its replica's, never
// the sender's own, and memStore answers alike. A writer's own record
// written since is kept, and a record written back verifies.
func TestShareScriptRestores(t *testing.T) {
	addr := testkit.RedisServer(t)
	rs := newRedisStore(&redis.UniversalOptions{Addrs: []string{addr}})
	defer rs.close()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	mem := newMemStore(time.Now)
	const tick = time.Hour
	tk := time.Now().UnixNano() / int64(tick)
	f := hostileFleet(t, mem, time.Now, 0)
	f.redisAt.Store(time.Now().UnixMicro())
	f.redisSeen.Store(time.Now().UnixNano())
	round := func(id string) *shareRound {
		return &shareRound{id: id, candidate: "run-1", stale: time.Hour, ttl: time.Minute}
	}
	send := func(id string, c uint32, restore []signedRec) shareReply {
		t.Helper()
		f.self = id
		calls := []shareCall{{rkey: "sketchproxy:{t1}k:abc", marker: "sketchproxy:{t1}run", tick: tick, c: c, d: c, at: tk, restore: restore}}
		f.sign(calls)
		got, _, _, err := rs.sync(context.Background(), round(id), calls, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _, _, _ := mem.sync(context.Background(), round(id), calls, nil)
		if g, w := describe(got[0]), describe(want[0]); g != w {
			t.Errorf("%s writes %d: Redis answered %s, memory %s", id, c, g, w)
		}
		for _, r := range got[0].recs {
			if !f.verify(calls[0].rkey, &r) {
				t.Errorf("%s writes %d: %s's record %s does not verify", id, c, r.id, r.String())
			}
		}
		return got[0]
	}
	count := func(rp shareReply, id string) int {
		for _, r := range rp.recs {
			if r.id == id {
				return int(r.c)
			}
		}
		return -1
	}
	r0 := send("r0", 40, nil).recs[0]
	send("r1", 10, nil)
	if err := admin.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	mem.flush()
	mine := signedRec{id: "r1", c: 99, d: 99, at: tk, ts: 1, mac: r0.mac} // its own: never written back
	rp := send("r1", 10, []signedRec{r0, mine})
	if c := count(rp, "r0"); c != 40 {
		t.Errorf("after a flush, r1 wrote r0's record back: r0 reads %d, want 40", c)
	}
	if c := count(rp, "r1"); c != 10 {
		t.Errorf("r1's own record reads %d, want the 10 it wrote, not one written back", c)
	}
	send("r0", 42, nil)
	if c := count(send("r2", 1, []signedRec{r0}), "r0"); c != 42 {
		t.Errorf("r0 wrote 42 since; a record written back over it reads %d, want 42 kept", c)
	}
}
