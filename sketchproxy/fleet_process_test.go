package sketchproxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
	"github.com/redis/go-redis/v9"
)

// Issue 47 through a real redis-server, with replicas as processes are:
// each a Middleware with a fleet of its own (its connections, heartbeat
// and name), deciding on the wall clock, since Redis's TIME dates the
// records. A fleet of N must admit at most the limit × 1.05 plus one
// burst over all replicas, in any window (procBound), and refuse no
// client under its limit. Each test keeps its window inside one tick of
// the limit (procTick): there a halving count only adds up, so what was
// admitted does not hang on how a busy machine schedules the requests,
// and one replica alone admits exactly the burst.

// procLimit is a limit of the real-process tests.
type procLimit struct {
	requests float64
	per      time.Duration
	burst    float64
}

// tick is the limit's halving tick (package rate's CompileHalving: Per ×
// Burst / (2 × Requests)), as the fleet's counts halve.
func (l procLimit) tick() time.Duration {
	return time.Duration(float64(l.per) * l.burst / (2 * l.requests))
}

// bound is what a fleet may admit of one key in a window of w: the limit
// × 1.05 plus one burst, in whole requests.
func (l procLimit) bound(w time.Duration) int {
	return int(1.05*l.requests*float64(w)/float64(l.per) + l.burst)
}

// procReplica starts a replica of limit l with fleet fc (its secret set
// here) and state file stateFile ("": none).
func procReplica(t *testing.T, l procLimit, fc FleetConfig, stateFile string) *Limiter {
	t.Helper()
	return procReplicaOn(t, l, fc, stateFile, nil, nil)
}

// procReplicaOn is procReplica on clock (nil: the wall clock), logging to
// log (nil: nowhere).
func procReplicaOn(t *testing.T, l procLimit, fc FleetConfig, stateFile string, clock epochsketch.Clock, log *slog.Logger) *Limiter {
	t.Helper()
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	fc.Secret = "a-secret-of-16-bytes-at-least"
	if fc.Interval == 0 {
		fc.Interval = Duration(100 * time.Millisecond)
	}
	c := &Config{
		Admin: "off", StateFile: stateFile,
		Sketch:  SketchConfig{Buckets: 1024}, // a state file of 64 KiB a sketch
		NewKeys: NewKeysConfig{Disabled: true},
		Fleet:   &fc,
		Rules:   []Rule{{Name: "limit", Limits: []Limit{{Name: "rate", Requests: l.requests, Per: Duration(l.per), Burst: l.burst}}}},
	}
	mw, err := New(c, http.NotFoundHandler(), Options{Clock: clock, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	lim := &Limiter{mw: mw, rule: mw.state.Load().set.Rules[0]}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// procReplicas starts n replicas r0, r1, ... of l with fleet fc.
func procReplicas(t *testing.T, n int, l procLimit, fc FleetConfig) []*Limiter {
	var ls []*Limiter
	for i := range n {
		c := fc
		c.ID = fmt.Sprint("r", i)
		ls = append(ls, procReplica(t, l, c, ""))
	}
	return ls
}

// warmReplicas starts n replicas of limit l on fc's Redis (as
// procReplicas), waits until each counts them all, and then until each
// is past its warm-up (four intervals plus a second from its first
// request: one of a key of its own here).
func warmReplicas(t *testing.T, n int, l procLimit, fc FleetConfig) []*Limiter {
	t.Helper()
	ls := procReplicas(t, n, l, fc)
	waitMembers(t, ls, int64(n))
	pastWarmUp(ls)
	return ls
}

// pastWarmUp waits until every replica of ls is past its warm-up: four
// intervals plus a second from its first request (one of a key of its
// own here), at the tests' interval of 100 ms.
func pastWarmUp(ls []*Limiter) {
	for i, r := range ls {
		r.Allow(fmt.Sprint("warm-up-", i))
	}
	time.Sleep(1500 * time.Millisecond)
}

// deadRedis is an address nothing listens on.
func deadRedis(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitMembers waits until every replica of ls is up and counts n replicas.
func waitMembers(t *testing.T, ls []*Limiter, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ok := true
		for _, l := range ls {
			ok = ok && l.mw.fleet.Stats().Up && l.mw.fleet.Stats().Replicas == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replicas did not all count %d replicas in 10 s", n)
		}
	}
}

// procTick waits, if need be, until the current tick of l (Unix-anchored,
// as the engines and Redis's TIME count ticks) has need left.
func procTick(t *testing.T, l procLimit, need time.Duration) {
	t.Helper()
	tick := l.tick()
	if need >= tick {
		t.Fatalf("a window of %v does not fit a tick of %v", need, tick)
	}
	if left := tick - time.Duration(time.Now().UnixNano()%int64(tick)); left < need {
		time.Sleep(left + 20*time.Millisecond)
	}
}

// procRun counts what a key's requests got.
type procRun struct {
	sent, admitted int
	first, last    time.Time
}

// send sends one request of key to l.
func (r *procRun) send(l *Limiter, key string) {
	now := time.Now()
	if r.sent == 0 {
		r.first = now
	}
	r.last = now
	r.sent++
	if l.Allow(key) {
		r.admitted++
	}
}

// check holds r to l's bound over its window, plus slack requests,
// after asserting that the fleet refused something, and that light's
// requests (a client under its limit) were all admitted.
func (r *procRun) check(t *testing.T, l procLimit, light procRun, slack int) {
	t.Helper()
	w := r.last.Sub(r.first)
	t.Logf("%d requests in %v: the fleet admitted %d, at most %d allowed (one replica alone admits %g in one tick); a client under its limit: %d of %d", r.sent, w.Round(time.Millisecond), r.admitted, l.bound(w)+slack, l.burst, light.admitted, light.sent)
	if r.admitted >= r.sent {
		t.Fatalf("the fleet refused none of %d requests: the limit never ran", r.sent)
	}
	if light.admitted != light.sent {
		t.Errorf("a client under its limit got %d of %d requests through", light.admitted, light.sent)
	}
	if r.admitted > l.bound(w)+slack {
		t.Errorf("the fleet admitted %d in %v: more than the limit × 1.05 plus a burst (%d), plus %d", r.admitted, w.Round(time.Millisecond), l.bound(w), slack)
	}
}

// Replicas started while Redis is unreachable count their peers from
// min_replicas, or from the last membership they saw: kept in the state
// file, or handed over (SIGUSR2) without one. Each then admits θ/N, and
// the fleet θ. Before, with neither (the default of 2 replicas, or only
// min_replicas' absence), 3 replicas admitted 30 of a burst of 20
// (1.5x); the last membership was not kept.
func TestFleetProcessRedisDownAtStart(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	dir := t.TempDir()
	// 3 replicas with Redis up count each other, and keep that in their
	// state files and in what a handover passes on.
	var handed [3]bytes.Buffer
	var up []*Limiter
	for i := range 3 {
		up = append(up, procReplica(t, l, FleetConfig{Redis: addr, ID: fmt.Sprint("r", i)}, filepath.Join(dir, fmt.Sprint("state", i))))
	}
	waitMembers(t, up, 3)
	for i, r := range up {
		if err := r.mw.WriteState(&handed[i]); err != nil {
			t.Fatal(err)
		}
		r.Close() // saves the state file
	}
	dead := deadRedis(t)
	for _, c := range []struct {
		name  string
		start func(i int) *Limiter
	}{
		{"min_replicas", func(i int) *Limiter {
			return procReplica(t, l, FleetConfig{Redis: dead, MinReplicas: 3, ID: fmt.Sprint("r", i)}, "")
		}},
		{"state_file", func(i int) *Limiter {
			return procReplica(t, l, FleetConfig{Redis: dead, ID: fmt.Sprint("r", i)}, filepath.Join(dir, fmt.Sprint("state", i)))
		}},
		{"handover", func(i int) *Limiter {
			r := procReplica(t, l, FleetConfig{Redis: dead, ID: fmt.Sprint("r", i)}, "")
			if err := r.mw.RestoreState(bytes.NewReader(handed[i].Bytes()), "handover"); err != nil {
				t.Fatal(err)
			}
			return r
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ls []*Limiter
			for i := range 3 {
				ls = append(ls, c.start(i))
			}
			for i, r := range ls {
				if s := r.mw.fleet.Stats(); s.Up || s.Replicas != 3 {
					t.Fatalf("replica %d: up %v, counting %d replicas with Redis unreachable, want 3", i, s.Up, s.Replicas)
				}
			}
			procTick(t, l, time.Second)
			var heavy, light procRun
			for i := range 90 {
				heavy.send(ls[i%3], "heavy")
			}
			for i := range 6 {
				light.send(ls[i%3], "light")
			}
			heavy.check(t, l, light, 0)
		})
	}
	// The figure docs/fleets.md gives for a fleet that says nothing of
	// its size: each of 3 assumes 2 replicas.
	t.Run("unknown", func(t *testing.T) {
		var heavy procRun
		ls := procReplicas(t, 3, l, FleetConfig{Redis: dead})
		procTick(t, l, time.Second)
		for i := range 90 {
			heavy.send(ls[i%3], "heavy")
		}
		t.Logf("nothing says how many replicas run: 3 admitted %d of a burst of %g", heavy.admitted, l.burst)
		if heavy.admitted != 30 {
			t.Errorf("3 replicas assuming 2 admitted %d, want 30 (θ/2 each)", heavy.admitted)
		}
	})
}

// Redis paused (SIGSTOP) for 0.7 s and resumed (SIGCONT), 3 times,
// while a client sends 40 requests a second, two thirds of them to one
// of 2 replicas: its guarantee is the larger, and its count passes θ/N.
// While Redis is paused each replica decides alone at θ/N, and no more
// than the room the other left at the last word from Redis.
func TestFleetProcessRedisPaused(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr, redisProc := testkit.RedisProcess(t)
	ls := procReplicas(t, 2, l, FleetConfig{Redis: addr, Timeout: Duration(50 * time.Millisecond)})
	waitMembers(t, ls, 2)
	procTick(t, l, 5*time.Second)
	var heavy, light procRun
	i := 0
	phase := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); i++ {
			heavy.send(ls[min(i%3, 1)], "heavy") // r0, r1, r1
			if i%20 == 0 {
				light.send(ls[i/20%2], "light")
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	phase(time.Second)
	for range 3 {
		redisProc.Signal(syscall.SIGSTOP)
		phase(700 * time.Millisecond)
		redisProc.Signal(syscall.SIGCONT)
		phase(400 * time.Millisecond)
	}
	heavy.check(t, l, light, 0)
}

// Redis paused 0.3 s (SIGSTOP, then SIGCONT) in the middle of a key's
// birth burst, 100 calls round robin over 3 replicas at 20 a minute: the
// pause outlasts the key's first two intervals (200 ms here). Each
// replica decides alone at its θ/N while Redis does not answer it, and a
// replica that claimed from the records as soon as Redis answered took
// the room the others had admitted alone: 18 to 26 of a burst of 20 in
// 16 runs of a review's test. Now a replica that saw Redis not answer (a
// round that failed, or a claim's send that waited half the timeout and
// failed) holds its views suspect until every replica may have written
// its record whole since Redis answered it (recovering): 18 to 20 in 24
// keys, under -race with a core kept busy too, and then 21 for the pause
// at the 10th call in 9 of 12 runs minutes later, on an idle machine, at
// this commit and at bfc3046 alike (the slack of 1).
func TestFleetProcessPausedAtBirth(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr, redisProc := testkit.RedisProcess(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
	waitMembers(t, ls, 3)
	for k, at := range []int{2, 4, 6, 10, 15, 30} {
		procTick(t, l, 450*time.Millisecond)
		var heavy procRun
		var paused sync.WaitGroup
		for i := range 100 {
			if i == at {
				paused.Go(func() {
					redisProc.Signal(syscall.SIGSTOP)
					time.Sleep(300 * time.Millisecond)
					redisProc.Signal(syscall.SIGCONT)
				})
			}
			heavy.send(ls[i%3], fmt.Sprint("paused-", k))
			time.Sleep(time.Millisecond)
		}
		paused.Wait()
		t.Logf("Redis paused at request %d:", at)
		failed := t.Failed()
		heavy.check(t, l, procRun{}, 1)
		if !failed && t.Failed() {
			// Read 23 once in a run of the package's fleet tests on a
			// busy machine (18 to 21 otherwise): what each replica saw.
			for i, r := range ls {
				t.Logf("replica %d: %+v", i, r.mw.fleet.Stats())
			}
		}
		time.Sleep(time.Second) // every replica's rounds answered again
	}
}

// Redis paused 2 s from the 5th call of a key's birth burst, the burst
// going on after it (900 calls 3 ms apart round robin over 3 replicas,
// 20 a minute): the replicas whose rounds failed back off to 1 s, so
// their records hold what they admitted alone only a second after Redis
// answers again. A suspect window of two intervals and a timeout after
// this replica's last failure ended before that: 23 to 26 of 20 in 4 of
// 18 keys in a review's test (and at cde6af9). It now lasts the longest
// backoff, a round and a timeout after Redis answered (recovering): 18
// to 20 in 10 keys.
func TestFleetProcessLongPauseAtBirth(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr, redisProc := testkit.RedisProcess(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
	waitMembers(t, ls, 3)
	for k := range 2 {
		procTick(t, l, 4*time.Second)
		var heavy procRun
		var paused sync.WaitGroup
		for i := range 900 {
			if i == 5 {
				paused.Go(func() {
					redisProc.Signal(syscall.SIGSTOP)
					time.Sleep(2 * time.Second)
					redisProc.Signal(syscall.SIGCONT)
				})
			}
			heavy.send(ls[i%3], fmt.Sprint("long-pause-", k))
			time.Sleep(3 * time.Millisecond)
		}
		paused.Wait()
		heavy.check(t, l, procRun{}, 0)
		time.Sleep(time.Second)
	}
}

// A replica restarted without a state_file (under a new name, as a new
// process is) has counted nothing of a key the others hold at its limit.
// In its warm-up a key joined its hot set at its third request, so each
// restart added two requests of such a key (22 of 20 over 3 replicas).
// Now each replica writes its heavy keys' tags to an index in Redis, and
// the restarted one shares those from their first request, which claims:
// nothing added; and a fresh key of a client under its limit on the
// restarted replica gets all of its requests through.
func TestFleetProcessRestartHeldKey(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	fc := FleetConfig{Redis: addr}
	ls := warmReplicas(t, 3, l, fc)
	marked := int64(0) // the index's bits set, at least
	for k := range 3 {
		if k > 0 {
			time.Sleep(3 * time.Second) // past the last restart: its old self is counted no more (two windows of stale)
		}
		procTick(t, l, 3*time.Second)
		key := fmt.Sprint("held-", k)
		heavy, light := holdIndexed(t, ls, addr, key, marked), procRun{}
		held := heavy.admitted
		marked++
		ls[k].Close()
		c := fc
		c.ID = fmt.Sprint("r", k, "-again")
		ls[k] = procReplica(t, l, c, "")
		sendWithLight(ls[k], &heavy, &light, key, fmt.Sprint("fresh-", k), 10)
		skipIfLate(t, ls)
		t.Logf("key %d: the fleet admitted %d of 60 (a burst of %g); the restarted replica admitted %d more of 10; a client under its limit got %d of %d", k, held, l.burst, heavy.admitted-held, light.admitted, light.sent)
		if held >= 60 {
			t.Fatalf("the fleet admitted all 60 before the restart: the limit never ran")
		}
		if heavy.admitted > int(l.burst) {
			t.Errorf("key %d: the fleet admitted %d in all, past the burst of %g: a restart added %d requests of a key held at its limit", k, heavy.admitted, l.burst, heavy.admitted-held)
		}
		if light.admitted != light.sent {
			t.Errorf("key %d: a client under its limit got %d of %d requests through on the restarted replica", k, light.admitted, light.sent)
		}
	}
}

// A replica restarted without a state_file whose traffic comes after
// its first answer from Redis's warm-up would have ended (a readiness
// delay, a balancer's slow start): its warm-up runs from its first
// request, so the index of heavy keys still holds a key the fleet holds
// at its limit there. Before, the warm-up ran from its first answer from
// Redis, and 3 s later the replica decided the key alone up to its
// promotion point: 23 of 20 (a review).
func TestFleetProcessRestartTrafficLate(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	ls, _, heavy := restartHolding(t, l, FleetConfig{})
	held, light := heavy.admitted, procRun{}
	time.Sleep(3 * time.Second) // twice the warm-up its first answer began (4 intervals and a second)
	sendWithLight(ls[0], &heavy, &light, "held", "fresh", 10)
	skipIfLate(t, ls)
	t.Logf("the fleet admitted %d of 60 (a burst of %g); the restarted replica, its first request 3 s after its start, admitted %d more of 10; a client under its limit got %d of %d",
		held, l.burst, heavy.admitted-held, light.admitted, light.sent)
	if held >= 60 {
		t.Fatalf("the fleet admitted all 60 before the restart: the limit never ran")
	}
	if heavy.admitted > int(l.burst) {
		t.Errorf("the fleet admitted %d in all, past the burst of %g: the restarted replica added %d requests of a key held at its limit", heavy.admitted, l.burst, heavy.admitted-held)
	}
	if light.admitted != light.sent {
		t.Errorf("a client under its limit got %d of %d requests through on the restarted replica", light.admitted, light.sent)
	}
}

// A writer without the secret sets every bit of the index of heavy keys
// (it is unsigned), and a replica restarts without a state_file: in its
// warm-up every mouse's first request then joined the hot set, and once
// the set was full (max_hot) every key past its promotion point was
// decided alone at θ/N: 26 of 20 for a key the others held at its limit
// (a review; at the default max_hot, 10,200 one-off keys in a second did
// it). The index promotes only while the set is under half full: a key
// held at its limit then adds 2 at most, as where Redis refuses the index.
func TestFleetProcessForgedIndex(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	fc := FleetConfig{Redis: addr, MaxHot: 50}
	ls := warmReplicas(t, 3, l, fc)
	procTick(t, l, 8*time.Second)
	heavy, light := holdIndexed(t, ls, addr, "held", 0), procRun{}
	held := heavy.admitted
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	gen := time.Now().UnixMicro() / time.Minute.Microseconds()
	ones := strings.Repeat("\xff", 1<<17)
	for g := gen - 1; g <= gen+1; g++ {
		if err := rdb.Set(ctx, fmt.Sprint("sketchproxy:{sketchproxy:hot}:", g), ones, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ls[0].Close()
	c := fc
	c.ID = "r0-again"
	ls[0] = procReplica(t, l, c, "")
	for i := range 60 {
		ls[0].Allow(fmt.Sprint("mouse-", i))
	}
	hot := ls[0].mw.fleet.Stats().HotKeys
	for i := range 10 {
		heavy.send(ls[0], "held")
		light.send(ls[0], "fresh")
		if i < 2 {
			light.send(ls[0], "fresh")
		}
		time.Sleep(10 * time.Millisecond)
	}
	skipIfLate(t, ls)
	t.Logf("every bit of the index set: 60 one-off keys made %d hot of max_hot 50; the fleet held the key at %d of a burst of %g, the restarted replica admitted %d more of 10; a client under its limit got %d of %d there",
		hot, held, l.burst, heavy.admitted-held, light.admitted, light.sent)
	if held >= 60 {
		t.Fatalf("the fleet admitted all 60 before the restart: the limit never ran")
	}
	if hot > 25 {
		t.Errorf("a forged index made %d one-off keys hot, past half of max_hot (25)", hot)
	}
	if heavy.admitted > int(l.burst)+2 {
		t.Errorf("the fleet admitted %d in all: a restart with the index forged added %d requests of a key held at its limit, want 2 at most", heavy.admitted, heavy.admitted-held)
	}
	if light.admitted != light.sent {
		t.Errorf("a client under its limit got %d of %d requests through on the restarted replica", light.admitted, light.sent)
	}
}

// skewed is the wall clock off by d.
type skewed time.Duration

func (d skewed) Now() time.Time { return time.Now().Add(time.Duration(d)) }

// One of 3 replicas runs its clock off Redis's (NTP off, a VM resumed).
// Replicas count on their own clocks and Redis dates the records on its
// own, so a skew moves the moments that replica's counts halve: a second
// ahead, its tick ends a second early, and the fleet's half burst of a
// tick's end comes back there early (30 where 21 were allowed inside one
// tick, in a review); an hour behind, its records are an hour old to the
// others. Moving a replica's engine onto Redis's clock instead was tried
// and taken out: a sketch never goes back, so every step back of the
// clock (a replica ahead corrected, a host clock stepped, Redis failed
// over) froze its counts for as long, and a client under its limit was
// refused for an hour in a review. This measures the exception
// docs/fleets.md gives (Clocks), holds it to the bound and a half burst,
// and holds that the replica reckons its skew and warns of it.
func TestFleetProcessClockSkew(t *testing.T) {
	for _, c := range []struct {
		name string
		skew time.Duration // the skewed replica's clock less Redis's
		// edge: the second batch just before the tick's end, past the
		// skewed replica's own (else in the same tick as the first)
		edge bool
	}{{"a second ahead", time.Second, true}, {"an hour behind", -time.Hour, false}} {
		t.Run(c.name, func(t *testing.T) {
			l := procLimit{requests: 20, per: 10 * time.Second, burst: 20} // a 5 s tick
			addr := testkit.RedisServer(t)
			var logs syncBuffer
			var ls []*Limiter
			for i := range 3 {
				fc := FleetConfig{Redis: addr, ID: fmt.Sprint("r", i), MinReplicas: 3}
				if i < 2 {
					ls = append(ls, procReplica(t, l, fc, ""))
					continue
				}
				ls = append(ls, procReplicaOn(t, l, fc, "", skewed(c.skew), slog.New(slog.NewTextHandler(&logs, nil))))
			}
			waitMembers(t, ls, 3)
			pastWarmUp(ls)
			if got := ls[2].mw.fleet.Stats().ClockSkew; (got + c.skew).Abs() > 50*time.Millisecond {
				t.Errorf("the skewed replica reckons its clock %v behind Redis's, want %v", got, -c.skew)
			}
			if !strings.Contains(logs.String(), "this replica's clock is") {
				t.Errorf("the skewed replica did not warn of its clock:\n%s", logs.String())
			}
			tick := l.tick()
			at := func(pos time.Duration) { // sleep until pos into the wall clock's tick
				if d := (pos - time.Duration(time.Now().UnixNano()%int64(tick)) + tick) % tick; d > 0 {
					time.Sleep(d)
				}
			}
			at(tick / 5)
			var heavy, light procRun
			for i := range 60 {
				heavy.send(ls[i%3], "held")
				time.Sleep(2 * time.Millisecond)
			}
			held := heavy.admitted
			if c.edge {
				at(tick - 600*time.Millisecond) // the skewed replica's tick ended 400 ms ago
			}
			var more [3]int
			for i := range 60 {
				before := heavy.admitted
				heavy.send(ls[i%3], "held")
				more[i%3] += heavy.admitted - before
				if i%20 == 0 {
					light.send(ls[i/20], "light")
				}
				time.Sleep(2 * time.Millisecond)
			}
			w := heavy.last.Sub(heavy.first)
			if heavy.last.UnixNano()/int64(tick) != heavy.first.UnixNano()/int64(tick) {
				t.Skipf("the run took %v and passed the tick's end (a starved machine): not the case measured", w.Round(time.Millisecond))
			}
			t.Logf("%s: the fleet held the key at %d, then admitted %d more %v (the skewed one last)", c.name, held, heavy.admitted-held, more)
			heavy.check(t, l, light, int(l.burst/2))
		})
	}
}

// One of 3 replicas restarted while Redis is unreachable, a key held at
// its limit: with a state_file it keeps its counts and adds nothing;
// without one it has counted nothing of what its previous self admitted,
// that count is only in Redis, and it admits its θ/N again, unseen: the
// exception docs/fleets.md gives (Whatever Redis does), measured here
// (26 of 20 in a review, 20 with a state_file).
func TestFleetProcessRestartWhileRedisDown(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(fmt.Sprint("state_file=", keep), func(t *testing.T) {
			l := procLimit{requests: 20, per: time.Minute, burst: 20}
			addr, redisProc := testkit.RedisProcess(t)
			fc := FleetConfig{Redis: addr, MinReplicas: 3}
			dir := t.TempDir()
			state := func(id string) string {
				if !keep {
					return ""
				}
				return filepath.Join(dir, id)
			}
			var ls []*Limiter
			for i := range 3 {
				c := fc
				c.ID = fmt.Sprint("r", i)
				ls = append(ls, procReplica(t, l, c, state(c.ID)))
			}
			waitMembers(t, ls, 3)
			pastWarmUp(ls)
			procTick(t, l, 10*time.Second)
			heavy, light := holdIndexed(t, ls, addr, "held", 0), procRun{}
			held := heavy.admitted
			redisProc.Kill()
			time.Sleep(300 * time.Millisecond)
			ls[0].Close() // saves its state file
			c := fc
			c.ID = "r0-again"
			ls[0] = procReplica(t, l, c, state("r0"))
			more := 0
			for i := range 30 {
				before := heavy.admitted
				heavy.send(ls[i%3], "held")
				if i%3 == 0 {
					more += heavy.admitted - before
					light.send(ls[i/3%3], "fresh")
				}
				time.Sleep(10 * time.Millisecond)
			}
			share := int(l.burst / 3)
			t.Logf("state_file %v: the fleet held the key at %d; Redis down, one replica restarted: %d more, %d of them there", keep, held, heavy.admitted-held, more)
			if keep {
				heavy.check(t, l, light, 0)
			} else {
				heavy.check(t, l, light, share)
			}
		})
	}
}

// One of 3 replicas restarted without a state_file, and then Redis lost
// its data (FLUSHALL 200 ms later): what the replica's previous self had
// admitted was only in Redis, and the restarted replica took it again,
// 27 of 20 (a review; through Caddy too). The replicas that find Redis
// empty write back the other replicas' records they last read, signed by
// their writers (Fleet.restoreLost): the burst.
func TestFleetProcessRestartThenFlush(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	ls, addr, heavy := restartHolding(t, l, FleetConfig{MinReplicas: 3})
	held, light := heavy.admitted, procRun{}
	time.Sleep(200 * time.Millisecond)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the others' rounds find Redis empty
	sendWithLight(ls[0], &heavy, &light, "held", "fresh", 10)
	skipIfLate(t, ls)
	t.Logf("the fleet held the key at %d; replica 0 restarted, then Redis flushed: %d more of 10 there; a client under its limit got %d of %d", held, heavy.admitted-held, light.admitted, light.sent)
	heavy.check(t, l, light, 0)
}

// restartHolding starts 3 replicas of l (fc on a redis-server of its
// own) past their warm-ups, holds the key "held" at its limit within a
// tick with 8 s left, and restarts replica 0 without a state_file under
// another name: the replicas, Redis's address and the key's requests.
func restartHolding(t *testing.T, l procLimit, fc FleetConfig) ([]*Limiter, string, procRun) {
	t.Helper()
	fc.Redis = testkit.RedisServer(t)
	ls := warmReplicas(t, 3, l, fc)
	procTick(t, l, 8*time.Second)
	heavy := holdIndexed(t, ls, fc.Redis, "held", 0)
	ls[0].Close()
	fc.ID = "r0-again"
	ls[0] = procReplica(t, l, fc, "")
	return ls, fc.Redis, heavy
}

// sendWithLight sends n requests of key to l, 10 ms apart, counted in
// heavy, and with every second one a request of lightKey (a client under
// its limit), counted in light.
func sendWithLight(l *Limiter, heavy, light *procRun, key, lightKey string, n int) {
	for i := range n {
		heavy.send(l, key)
		if i%2 == 0 {
			light.send(l, lightKey)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// holdIndexed holds key at its limit with 60 calls round robin over ls,
// and waits until the index of heavy keys on the redis-server at addr
// has more than n bits set (the key marked).
func holdIndexed(t *testing.T, ls []*Limiter, addr, key string, n int64) procRun {
	t.Helper()
	var r procRun
	for i := range 60 {
		r.send(ls[i%len(ls)], key)
		time.Sleep(2 * time.Millisecond)
	}
	waitIndexed(t, addr, n)
	return r
}

// waitIndexed waits until the index of heavy keys on the redis-server at
// addr has more than n bits set in its newest generation (the rounds
// after a key turned heavy mark it; a starved machine runs them late).
func waitIndexed(t *testing.T, addr string, n int64) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		keys, err := rdb.Keys(ctx, "sketchproxy:{sketchproxy:hot}:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(keys)
		if len(keys) > 0 {
			newest := keys[len(keys)-1] // generations of equal length: sorted by number
			if c, err := rdb.BitCount(ctx, newest, nil).Result(); err == nil && c > n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the index of heavy keys has no more than %d bits set after 10 s (keys %v)", n, keys)
		}
	}
}

// One of 2 replicas restarted 3 times without a state_file, a client at
// 40 requests a second round robin. Each new process has counted nothing
// of the key the fleet holds at its limit: before, it admitted up to the
// promotion point of it unseen (p/2 + 1 requests: 5 of a burst of 40
// here) at each restart; then, in its warm-up, a key joined the hot set
// at its third request (46); now at its first where the index of heavy
// keys holds it (40: the burst).
func TestFleetProcessReplicaRestarts(t *testing.T) {
	l := procLimit{requests: 200, per: time.Minute, burst: 40} // a 6 s tick
	addr := testkit.RedisServer(t)
	fc := FleetConfig{Redis: addr}
	ls := procReplicas(t, 2, l, fc)
	waitMembers(t, ls, 2)
	procTick(t, l, 5*time.Second)
	var heavy, light procRun
	i := 0
	phase := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); i++ {
			heavy.send(ls[i%2], "heavy")
			if i%10 == 0 {
				light.send(ls[i/10%2], "light")
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	phase(time.Second)
	for k := range 3 {
		ls[1].Close()
		c := fc
		c.ID = fmt.Sprint("r1-", k+1)
		ls[1] = procReplica(t, l, c, "")
		phase(time.Second)
	}
	heavy.check(t, l, light, 0)
}

// 100 calls in 100 ms over 3 replicas at 20 a minute, each of 3 fresh
// keys: the replicas' views of a key just shared are of other moments,
// and each spent its quiet share of the pool unseen while the others
// took it again (22 of 20 at 8e1eb9e; the issue measured 20, 21 and 23;
// 22 to 24 before claims). While a key is young, a request past what
// Redis holds for its replica claims its count and decides from the
// claim's reply (docs/fleets.md, A key just shared): the burst, and a
// client under its limit gets all of its requests through.
func TestFleetProcessBurst(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
	waitMembers(t, ls, 3)
	for k := range 3 {
		procTick(t, l, 500*time.Millisecond)
		var heavy, light procRun
		sendBurst(ls, &heavy, &light, fmt.Sprint("heavy-", k), fmt.Sprint("light-", k))
		skipIfLate(t, ls)
		heavy.check(t, l, light, 0)
	}
}

// TestFleetProcessBurst with a writer without the secret rewriting every
// hot key's born (unsigned) to long ago, every millisecond: Redis then
// calls a key just shared old. When the replicas took its word, their
// requests stopped claiming and the burst at the key's birth came back
// (22 to 24 of 20 in a review's run); a key's youth is now each
// replica's own word, and born only holds more room.
func TestFleetProcessBurstBornForged(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
	waitMembers(t, ls, 3)
	a := &attacker{t: t, ctx: context.Background(), rdb: redis.NewClient(&redis.Options{Addr: addr})}
	defer a.rdb.Close()
	var forged atomic.Int64
	stop := everyMillisecond(func() {
		for _, k := range a.hashes() {
			if a.rdb.HSet(a.ctx, k, "born", "0").Err() == nil {
				forged.Add(1)
			}
		}
	})
	for k := range 3 {
		procTick(t, l, 500*time.Millisecond)
		var heavy, light procRun
		sendBurst(ls, &heavy, &light, fmt.Sprint("heavy-", k), fmt.Sprint("light-", k))
		if k == 2 {
			stop()
		}
		skipIfLate(t, ls)
		heavy.check(t, l, light, 0)
	}
	if forged.Load() == 0 {
		t.Fatal("no born was rewritten: the case measures nothing")
	}
	t.Logf("born rewritten %d times", forged.Load())
}

// A key past its first two intervals on every replica, no fault, then a
// burst: 90 requests at once, or 100 in 100 ms, over 3 replicas at 20 a
// minute. Such a key is past the claims of its birth; a request past its
// replica's quiet share of the pool was decided from the view and
// published after, so the requests in flight together on each replica
// took the whole room that replica had last seen: 36 of a burst of 20 at
// once (a review's test, and at 7b73b5f). Then such a request claimed
// and waited, as a young key's do, but each replica still spent its
// quiet share first, reckoned at its last round, which the others'
// claims took again: 20 to 21 at once, 22 spread over 100 ms (the test
// allowed 2 more). Now every request past its replica's guarantee (and
// what Redis holds for it) claims: 20, and 21 in 1 of 12 keys and 2 of
// 16 under -race in a review's runs (always 90 at once), which the slack
// of 1 allows.
func TestFleetProcessBurstPastYoung(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	ls := warmReplicas(t, 3, l, FleetConfig{Redis: addr})
	for k := range 4 {
		procTick(t, l, 3*time.Second)
		key := fmt.Sprint("past-young-", k)
		var heavy, light procRun
		for i := range 12 { // 4 on each replica: shared on each
			heavy.send(ls[i%3], key)
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Second) // past its first two intervals everywhere
		if k%2 == 0 {
			heavy.admitted += int(allAtOnce(ls, key, 90))
			heavy.sent += 90
			heavy.last = time.Now()
		} else {
			sendBurst(ls, &heavy, &light, key, "")
		}
		skipIfLate(t, ls)
		heavy.check(t, l, light, 1)
	}
}

// A limit whose fair share θ/N holds no whole request (1 a second, a
// burst of 1, over 3 replicas): every key is shared from its first
// request, and past its first two intervals each replica's requests past
// what Redis holds for it claim, as a larger limit's past its guarantee
// do, and no replica holds a guarantee (the pool is the whole limit).
// Before, they were decided from the view and published after, and
// requests at once on each replica passed the limit by a request per
// replica where the room came back (6 where 4 were allowed in a review's
// test: 3 requests at once, one on each replica, every 100 ms). Here 9
// at once, 3 on each replica, every 20 ms for 2 s, for 12 keys together,
// each from another moment of the tick.
func TestFleetProcessSmallLimitAtOnce(t *testing.T) {
	l := procLimit{requests: 1, per: time.Second, burst: 1}
	addr := testkit.RedisServer(t)
	ls := warmReplicas(t, 3, l, FleetConfig{Redis: addr})
	cmds, claims := fleetCost(ls)
	var heavy, light [12]procRun
	var wg sync.WaitGroup
	for k := range heavy {
		wg.Go(func() {
			// Each from another moment of the tick (0.5 s).
			time.Sleep(time.Duration(k) * l.tick() / time.Duration(len(heavy)))
			key := fmt.Sprint("small-at-once-", k)
			r := &heavy[k]
			for i := range 100 {
				now := time.Now()
				if r.sent == 0 {
					r.first = now
				}
				r.last = now
				r.admitted += int(allAtOnce(ls, key, 9))
				r.sent += 9
				if i%60 == 0 { // a client under its limit: one every 1.2 s
					light[k].send(ls[(k+i/60)%3], fmt.Sprint("small-calm-", k))
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	skipIfLate(t, ls)
	c1, c2 := fleetCost(ls)
	t.Logf("%d Redis commands, %d claims published", c1-cmds, c2-claims)
	for k := range heavy {
		heavy[k].check(t, l, light[k], 0)
	}
}

// fleetCost is what ls's fleets sent Redis so far: commands, and claims
// published.
func fleetCost(ls []*Limiter) (cmds, claims uint64) {
	for _, l := range ls {
		st := l.mw.fleet.Stats()
		cmds, claims = cmds+st.Commands, claims+st.Claims
	}
	return cmds, claims
}

// skipIfLate skips a burst test whose replicas had claims that Redis did
// not answer within the timeout: on a machine that starved the run (a
// CI run beside the other packages' tests, under -race), the replicas
// then decided at θ/N, as while Redis is down, which is not the case the
// test measures.
func skipIfLate(t *testing.T, ls []*Limiter) {
	t.Helper()
	var late uint64
	for _, l := range ls {
		late += l.mw.fleet.Stats().Late
	}
	if late > 0 {
		t.Skipf("%d requests' claims passed the fleet's timeout (the machine starved the run): decided at θ/N, not the case measured", late)
	}
}

// sendBurst sends 100 requests of heavyKey in 100 ms round robin over
// ls (3 replicas) into heavy, and with lightKey, 5 of a client under its
// limit into light.
func sendBurst(ls []*Limiter, heavy, light *procRun, heavyKey, lightKey string) {
	for i := range 100 {
		heavy.send(ls[i%3], heavyKey)
		if lightKey != "" && i%20 == 0 {
			light.send(ls[i/20%3], lightKey)
		}
		time.Sleep(time.Millisecond)
	}
}

// allAtOnce starts n requests of key together, round robin over ls (3
// replicas), and returns how many were admitted.
func allAtOnce(ls []*Limiter, key string, n int) int64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			if ls[i%3].Allow(key) {
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	return admitted.Load()
}

// everyMillisecond runs do every millisecond on a goroutine of its own
// until the returned stop, which waits for it.
func everyMillisecond(do func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			do()
		}
	})
	return func() { close(done); wg.Wait() }
}

// The burst of TestFleetProcessBurst sent all at once: 90 requests of a
// fresh key started together, 30 on each of 3 replicas at 20 a minute.
// Requests that reach one replica together each read its count before
// the others counted: 18 to 24 at a549b44, 30 in a CI run beside other
// packages' tests, before claims. A claimed request holds its room until
// the engine settles it (counted, or refused after all), so two in flight
// never take one claim: the burst.
func TestFleetProcessBurstConcurrent(t *testing.T) {
	l := procLimit{requests: 20, per: time.Minute, burst: 20}
	addr := testkit.RedisServer(t)
	ls := procReplicas(t, 3, l, FleetConfig{Redis: addr})
	waitMembers(t, ls, 3)
	for k := range 3 {
		procTick(t, l, 500*time.Millisecond)
		got := allAtOnce(ls, fmt.Sprint("together-", k), 90)
		skipIfLate(t, ls)
		t.Logf("key %d: 90 requests at once over 3 replicas at 20 a minute: the fleet admitted %d", k, got)
		if got == 0 || got >= 90 {
			t.Fatalf("the fleet admitted %d of 90: the case measures no limit", got)
		} else if got > int64(l.bound(0)) {
			t.Errorf("the fleet admitted %d of 90 requests sent at once, more than the burst of %d", got, l.bound(0))
		}
	}
}
