package sketchproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// Issue 47's hostile cases on a real redis-server: whoever can write to
// Redis without the fleet's secret (FLUSHALL, DEL, HSET on the records,
// PUBLISH on the claims channel) must not make a fleet admit more than the
// limit × 1.05 plus one burst over all replicas, nor refuse a client under
// its limit. Two replicas (two Limiters of one fleet section: each fleet
// is a replica of its own, fleet.self) at 20 a minute, burst 20: θ = 40
// counts and a halving tick of 30 s (rate.CompileHalving), the whole run
// of 20 s inside one tick, so that nothing halves and one replica alone
// admits exactly the burst. A client sends 40 requests a second round
// robin; another sends 16 in all, one every 1.25 s (under its burst: one
// replica alone admits every one); the attack runs every 200 ms.
const (
	hostileRequests = 20
	hostileTick     = 30 * time.Second
	hostileWindow   = 20 * time.Second
	hostilePrefix   = "sketchproxy:"
)

// attacker writes to the fleet's Redis without its secret.
type attacker struct {
	t   *testing.T
	ctx context.Context
	rdb *redis.Client

	mu     sync.Mutex
	claims []string // genuine claims heard, latest last
}

// hashes are the hot keys' records in Redis.
func (a *attacker) hashes() []string {
	keys, err := a.rdb.Keys(a.ctx, hostilePrefix+"{*}k:*").Result()
	if err != nil {
		a.t.Log(err)
	}
	return keys
}

// redisNow is Redis's clock in µs, which a writer can read as well as a
// replica (TIME).
func (a *attacker) redisNow() int64 {
	tm, err := a.rdb.Time(a.ctx).Result()
	if err != nil {
		return time.Now().UnixMicro()
	}
	return tm.UnixMicro()
}

// rewrite rewrites every replica's record of every hot key (the fields
// r:<id>, and s:<id> where there is one) as edit returns its words.
func (a *attacker) rewrite(edit func(field string, w []string) []string) {
	for _, k := range a.hashes() {
		h, err := a.rdb.HGetAll(a.ctx, k).Result()
		if err != nil {
			continue
		}
		var kv []any
		for f, v := range h {
			if !strings.HasPrefix(f, "r:") && !strings.HasPrefix(f, "s:") {
				continue
			}
			kv = append(kv, f, strings.Join(edit(f, strings.Fields(v)), " "))
		}
		if len(kv) > 0 {
			a.rdb.HSet(a.ctx, k, kv...)
		}
	}
}

// ghost adds, to every hot key, the record of a replica that does not
// exist, with a huge count and demand, in both record forms.
func (a *attacker) ghost() {
	now := a.redisNow()
	tick := now / hostileTick.Microseconds()
	for _, k := range a.hashes() {
		a.rdb.HSet(a.ctx, k,
			"r:ghost", fmt.Sprintf("1000000 1000000 0 %d %d", now, tick),
			"s:ghost", fmt.Sprintf("1000000 1000000 0 %d %d %s", tick, now, strings.Repeat("0", 32)))
	}
}

// forgeClaims publishes claims no script wrote: a ghost with a huge count
// on every hot key (in the claim forms of old and new replicas), and each
// genuine claim heard lately changed three ways: dated 200 ms later on
// the next tick (every count halved once more), every count zeroed, and a
// ghost with a huge count added.
func (a *attacker) forgeClaims() {
	now := a.redisNow()
	us := hostileTick.Microseconds()
	pub := func(p string) { a.rdb.Publish(a.ctx, hostilePrefix+"claims", p) }
	for _, k := range a.hashes() {
		pub(fmt.Sprintf("%s %d %d %d ghost 1000000 1000000 0", k, now/us, now-1000, now))
		pub(fmt.Sprintf("%s %d %d %d ghost 1000000 1000000 0 %d %d %s", k, now/us, now-1000, now, now/us, now, strings.Repeat("0", 32)))
	}
	a.mu.Lock()
	heard := append([]string(nil), a.claims...)
	a.mu.Unlock()
	for _, c := range heard[max(0, len(heard)-4):] {
		w := strings.Fields(c)
		if len(w) < 8 {
			continue
		}
		later := now + 200_000
		shifted := append([]string{w[0], strconv.FormatInt(later/us+1, 10), w[2], strconv.FormatInt(later, 10)}, w[4:]...)
		pub(strings.Join(shifted, " "))
		zeroed := append([]string(nil), w...)
		recs := claimRecords(w[4:])
		for _, r := range recs {
			for j := 1; j <= 3 && r+4+j < len(zeroed); j++ {
				zeroed[r+4+j] = "0"
			}
		}
		pub(strings.Join(zeroed, " "))
		if len(recs) > 0 {
			last := append([]string(nil), w[4+recs[len(recs)-1]:]...)
			last[0], last[1], last[2] = "ghost", "1000000", "1000000"
			pub(strings.Join(append(append([]string(nil), w...), last...), " "))
		}
	}
}

var macWord = regexp.MustCompile(`^[0-9a-f]{32}$`)

// claimRecords are the offsets of the records in a claim's words after
// its head: each starts with a replica's id, the only words that are not
// numbers (a replica's id has a letter; so does a MAC, but for one in 10^7).
func claimRecords(w []string) []int {
	var at []int
	for i, s := range w {
		if _, err := strconv.ParseInt(s, 10, 64); err != nil && !macWord.MatchString(s) {
			at = append(at, i)
		}
	}
	return at
}

// listen keeps the genuine claims the replicas publish.
func (a *attacker) listen(ready chan<- struct{}) func() {
	ps := a.rdb.Subscribe(a.ctx, hostilePrefix+"claims")
	if _, err := ps.Receive(a.ctx); err != nil {
		a.t.Fatal(err)
	}
	close(ready)
	go func() {
		for m := range ps.Channel() {
			if strings.Contains(m.Payload, "ghost") {
				continue // its own
			}
			a.mu.Lock()
			a.claims = append(a.claims, m.Payload)
			if len(a.claims) > 64 {
				a.claims = a.claims[32:]
			}
			a.mu.Unlock()
		}
	}()
	return func() { ps.Close() }
}

// hostileCase is one attack, run on its own redis-server.
type hostileCase struct {
	name   string
	attack func(a *attacker)
	// n replicas (0: 2), and the fleet's replicas setting (0: counted by
	// heartbeat).
	n, replicas int
}

// hostileRun is one case's replicas, attacker and outcome.
type hostileRun struct {
	hostileCase
	a  *attacker
	ls []*Limiter

	hot, hotSent, calm, calmRefused int
	// fewest is the fewest replicas any of them counted during the run.
	fewest      int64
	start, last time.Time
	// failed counts the rounds of its replicas that failed or passed the
	// timeout during the run, and their requests whose claims did.
	failed uint64
}

// roundErrors is the rounds of r's replicas that failed or passed the
// timeout so far.
func (r *hostileRun) roundErrors() uint64 {
	var n uint64
	for _, l := range r.ls {
		st := l.mw.fleet.Stats()
		n += st.RoundErrors + st.Late // a claim past the timeout too
	}
	return n
}

// hostileCases are issue 47's hostile cases, and a control.
var hostileCases = []hostileCase{
	{name: "none", attack: func(*attacker) {}},
	// (a) FLUSHALL: every record, marker and heartbeat lost.
	{name: "flushall", attack: func(a *attacker) { a.rdb.FlushAll(a.ctx) }},
	// (b) DEL of the hot keys' hashes.
	{name: "del", attack: func(a *attacker) {
		if ks := a.hashes(); len(ks) > 0 {
			a.rdb.Del(a.ctx, ks...)
		}
	}},
	// (c) Every record rewritten "0 0 0 now tick" (the signed form's
	// count, demand and guarantee zeroed, its tick, time and MAC kept).
	{name: "zero", attack: func(a *attacker) {
		now := a.redisNow()
		a.rewrite(func(f string, w []string) []string {
			if strings.HasPrefix(f, "r:") {
				return []string{"0", "0", "0", strconv.FormatInt(now, 10), strconv.FormatInt(now/hostileTick.Microseconds(), 10)}
			}
			for i := 0; i < 3 && i < len(w); i++ {
				w[i] = "0"
			}
			return w
		})
	}},
	// (d) Only the guarantees zeroed, counts and demands kept: a reader
	// that believed it would take the others' guarantees as its room.
	{name: "zero-guarantees", attack: zeroGuarantees},
	{name: "zero-guarantees-3", attack: zeroGuarantees, n: 3, replicas: 3},
	// (e) The record of a replica that does not exist, with a huge count:
	// believed, it refuses every client of the key.
	{name: "ghost", attack: (*attacker).ghost},
	// (f) Claims published on the channel: made up (a ghost with a huge
	// count) and genuine ones altered (dated on the next tick, counts
	// zeroed, a ghost added).
	{name: "forged-claims", attack: (*attacker).forgeClaims},
	// (g) Every hot key's born (unsigned) rewritten to long ago: Redis
	// then calls a key just shared old. Before a key's youth was its
	// replica's own word, its requests stopped claiming and the birth
	// burst came back (22 to 24 of 20).
	{name: "born-old", attack: func(a *attacker) {
		for _, k := range a.hashes() {
			a.rdb.HSet(a.ctx, k, "born", "0")
		}
	}},
	// (h) Made-up members, in the sorted set and in the signed hash (a
	// fresh time, any MAC), 50 of each every 200 ms: counted, each
	// replica took a share of 52 and refused more.
	{name: "members", attack: forgeMembers},
	{name: "born-old-3", attack: func(a *attacker) {
		for _, k := range a.hashes() {
			a.rdb.HSet(a.ctx, k, "born", "0")
		}
	}, n: 3, replicas: 3},
}

func forgeMembers(a *attacker) {
	tm, err := a.rdb.Time(a.ctx).Result()
	if err != nil {
		return
	}
	for i := range 50 {
		id := fmt.Sprint("ghost-", i)
		a.rdb.ZAdd(a.ctx, hostilePrefix+"members", redis.Z{Score: float64(tm.UnixMilli()), Member: id})
		a.rdb.HSet(a.ctx, hostilePrefix+"{"+hostilePrefix+"members}:signed", id, fmt.Sprintf("%d %s", tm.UnixMicro(), strings.Repeat("0", 32)))
	}
}

func zeroGuarantees(a *attacker) {
	a.rewrite(func(_ string, w []string) []string {
		if len(w) > 2 {
			w[2] = "0"
		}
		return w
	})
}

// TestFleetRedisHostile runs every case at once (each on its own
// redis-server, so that the run fits in one tick without waiting for a
// tick per case), then checks each in a subtest: the fleet refused
// something; it admitted the client at 40/s at most the limit × 1.05 plus
// a burst over the run (20 + 1.05 × 20/min × 20 s = 27; one replica alone
// admits 20 in a tick, and the fleet 20 with claims at the key's birth,
// 20 to 24 before: docs/fleets.md, A key just shared); and no request of the client
// under its limit was refused. Before signed records (8e1eb9e) the ghost
// record had 8 of the 16 refused, forged claims 5 to 9; before a record
// read lower than it halves was kept (e5f29dc), FLUSHALL admitted 30, DEL
// 30, records zeroed 40 and forged claims 40.
func TestFleetRedisHostile(t *testing.T) {
	runs := make([]*hostileRun, len(hostileCases))
	for i, c := range hostileCases {
		runs[i] = startHostile(t, c)
	}
	// Both fleets of every case count both replicas before the first
	// request: a replica's first heartbeat may count itself alone (N = 1)
	// until its next round, which these cases are not about.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ready := true
		for _, r := range runs {
			for _, l := range r.ls {
				ready = ready && l.mw.fleet.Stats().Replicas == int64(len(r.ls))
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleets do not count their replicas after 10 s")
		}
	}
	// The run, from the first request to the last, inside one tick: wait
	// for the next tick where this one has too little left.
	now := time.Now()
	if left := hostileTickEnd(now).Sub(now); left < hostileWindow+time.Second {
		time.Sleep(left + 100*time.Millisecond)
	}
	start := time.Now()
	stop := start.Add(hostileWindow)
	if e := hostileTickEnd(start).Add(-300 * time.Millisecond); e.Before(stop) {
		stop = e
	}
	var wg sync.WaitGroup
	for _, r := range runs {
		wg.Go(func() {
			before := r.roundErrors()
			r.run(start, stop)
			r.failed = r.roundErrors() - before
		})
	}
	wg.Wait()
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) { r.check(t) })
	}
}

// hostileTickEnd is when the tick t is in ends (ticks are Unix-anchored).
func hostileTickEnd(t time.Time) time.Time {
	return time.Unix(0, (t.UnixNano()/int64(hostileTick)+1)*int64(hostileTick))
}

// startHostile starts a case's redis-server, attacker and replicas.
func startHostile(t *testing.T, c hostileCase) *hostileRun {
	addr := testkit.RedisServer(t)
	ctx := context.Background()
	r := &hostileRun{hostileCase: c, a: &attacker{t: t, ctx: ctx, rdb: redis.NewClient(&redis.Options{Addr: addr})}}
	t.Cleanup(func() { r.a.rdb.Close() })
	ready := make(chan struct{})
	t.Cleanup(r.a.listen(ready))
	<-ready
	fc := &FleetConfig{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: "hostile", Replicas: c.replicas}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.ls = make([]*Limiter, max(2, c.n))
	for i := range r.ls {
		l, err := NewLimiter(LimiterConfig{Requests: hostileRequests, Per: time.Minute, Fleet: fc, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		r.ls[i] = l
	}
	return r
}

// run sends the two clients' requests from start to stop, the attack
// running every 200 ms.
func (r *hostileRun) run(start, stop time.Time) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(200 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				r.attack(r.a)
			}
		}
	})
	hot, calm := "hot-"+r.name, "calm-"+r.name
	r.start, r.fewest = start, math.MaxInt64
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * 25 * time.Millisecond)
		if at.After(stop) {
			break
		}
		time.Sleep(time.Until(at))
		r.hotSent++
		if r.ls[i%len(r.ls)].Allow(hot) {
			r.hot++
		}
		if i%50 == 25 { // 16 in 20 s, on each replica in turn
			r.calm++
			if !r.ls[(i/50)%len(r.ls)].Allow(calm) {
				r.calmRefused++
			}
		}
		for _, l := range r.ls {
			r.fewest = min(r.fewest, l.mw.fleet.Stats().Replicas)
		}
		r.last = time.Now()
	}
	close(done)
	wg.Wait()
}

// check holds the case to the bound.
func (r *hostileRun) check(t *testing.T) {
	if hostileTickEnd(r.start) != hostileTickEnd(r.last) {
		t.Skipf("the run crossed a tick's end (the machine starved it): its counts halved")
	}
	if r.failed > 0 {
		// No attack here makes a round fail: a round that passed the
		// timeout is the machine starving the run (all the cases at once,
		// under -race, beside other packages' tests), and the replicas
		// then decided alone at θ/N, which is not what the case measures.
		t.Skipf("%d rounds or claims failed or passed the timeout during the run (the machine starved it): the replicas decided alone at θ/N, not under the attack", r.failed)
	}
	w := r.last.Sub(r.start)
	bound := int(math.Floor(hostileRequests + 1.05*hostileRequests*w.Minutes()))
	var rejected uint64
	for _, l := range r.ls {
		rejected += l.mw.fleet.Stats().Rejected
	}
	t.Logf("%s: the client at 40/s: %d of %d admitted in %v (bound %d); the client under its limit: %d of %d refused; %d records or claims rejected", r.name, r.hot, r.hotSent, w.Round(time.Millisecond), bound, r.calmRefused, r.calm, rejected)
	if r.hot >= r.hotSent || r.hot == 0 {
		t.Fatalf("the fleet admitted %d of %d: it refused nothing, or everything; the case measures no limit", r.hot, r.hotSent)
	}
	if r.hot > bound {
		t.Errorf("%s: the fleet admitted %d of the client at 40/s in %v, more than the limit × 1.05 plus a burst (%d)", r.name, r.hot, w.Round(time.Millisecond), bound)
	}
	if r.calmRefused > 0 {
		t.Errorf("%s: %d of %d requests of a client under its limit (one replica alone admits them all) refused", r.name, r.calmRefused, r.calm)
	}
	for i, l := range r.ls {
		if n := l.mw.fleet.Stats().Replicas; n != int64(len(r.ls)) {
			t.Errorf("%s: replica %d counts %d replicas at the end, want %d", r.name, i, n, len(r.ls))
		}
	}
	if r.fewest != int64(len(r.ls)) {
		// FLUSHALL every 200 ms, faster than the replicas beat, left
		// the one that beat first counting itself alone (once in CI)
		// before the heartbeats were published on the members' channel.
		t.Errorf("%s: a replica counted %d replicas during the run, want %d throughout", r.name, r.fewest, len(r.ls))
	}
}
