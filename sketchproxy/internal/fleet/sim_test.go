package fleet

import (
	cheap "container/heap"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// fleetSim runs N replicas (each an engine with its fleet) and one replica
// alone, on one manual clock, against a memStore: the engine's decisions
// and the fleet's arithmetic as they run in the proxy, with the network
// reduced to a delay that the test sets (a round trip for a send, as much
// again for a published claim to reach the others). Deterministic.
type fleetSim struct {
	t      testing.TB
	clk    *epochsketch.ManualClock
	store  *memStore
	fleets []*Fleet
	engs   []*engine.Engine
	sets   []*engine.Set
	alone  *engine.Engine
	one    *engine.Set
	rtt    time.Duration
	events simEvents
	seq    int
	queued []bool // a fleet's send of queued entries is scheduled
	// delivering: a delivery of the claims published is scheduled.
	delivering bool
	gone       []bool // a replica that stopped: no rounds, no requests
	// restart replaces replica i by a new process named id: a new
	// engine (nothing counted, no state_file) and a new fleet.
	restart func(i int, id string)
	sc      engine.Scratch
}

type simEvent struct {
	at  time.Time
	seq int
	do  func()
}

type simEvents []simEvent

func (q simEvents) Len() int { return len(q) }
func (q simEvents) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q simEvents) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simEvents) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *simEvents) Pop() any {
	o := *q
	x := o[len(o)-1]
	*q = o[:len(o)-1]
	return x
}

// newFleetSim starts n replicas sharing the rule "api" with limit r,
// rounds every interval (500 ms, the default) at staggered phases, and
// one replica alone; replicas 0 means the replicas count each other
// through the heartbeat.
func newFleetSim(t testing.TB, n int, r rate.Rate, replicas int) *fleetSim {
	return newFleetSimRule(t, n, engine.RuleSpec{Name: "api", Limits: []engine.LimitSpec{{Name: "rate", Rate: r}}}, replicas)
}

// simFleetConfig is the fleet section of the sim's replica id: its
// defaults, replicas set.
func simFleetConfig(id string, replicas int) *config.FleetConfig {
	return &config.FleetConfig{Replicas: replicas, ID: id, Interval: config.Duration(500 * time.Millisecond),
		Timeout: config.Duration(250 * time.Millisecond), PromoteFraction: 0.5, MaxHot: 10000, Prefix: "sketchproxy:", WalletOnFailure: "closed"}
}

// newFleetSimRule is newFleetSim with the rule rs.
func newFleetSimRule(t testing.TB, n int, rs engine.RuleSpec, replicas int) *fleetSim {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	s := &fleetSim{t: t, clk: clk, store: newMemStore(clk.Now), rtt: time.Millisecond, queued: make([]bool, n), gone: make([]bool, n)}
	spec := &engine.Spec{
		Buckets: 1 << 10,
		Rules:   []engine.RuleSpec{rs},
		Tarpit:  engine.TarpitSpec{DelayAbove: 1, DripAbove: 1.5, RejectAbove: 2, BanAbove: 8, BanFor: 10 * time.Minute, MaxHeld: 256, MaxHeldPerKey: 2},
		NewKeys: engine.NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
	}
	compile := func(e *engine.Engine) *engine.Set {
		set, err := e.Compile(spec, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Retire(set, nil) })
		return set
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		cfg := simFleetConfig(fmt.Sprint("r", i), replicas)
		f := newFleetOn(cfg, []byte("0123456789abcdef"), s.store, log, clk.Now)
		s.store.listen(f.channel(), f.hear, func() {}, nil)
		s.store.listen(f.beatChannel(), f.hearBeat, func() {}, nil)
		e := engine.New(engine.Options{Clock: clk, Seed: uint64(i + 1), Fleet: f})
		s.fleets, s.engs, s.sets = append(s.fleets, f), append(s.engs, e), append(s.sets, compile(e))
		phase := time.Duration(i) * 500 * time.Millisecond / time.Duration(n)
		s.every(clk.Now().Add(phase+7*time.Millisecond), 500*time.Millisecond, func() {
			if !s.gone[i] {
				s.fleets[i].round()
				s.deliverSoon()
			}
		})
	}
	s.alone = engine.New(engine.Options{Clock: clk, Seed: 99, Halving: true}) // counting as the fleet does
	s.one = compile(s.alone)
	s.restart = func(i int, id string) {
		f := newFleetOn(s.fleets[i].cfg, []byte("0123456789abcdef"), s.store, log, clk.Now)
		f.self = id
		s.store.listen(f.channel(), f.hear, func() {}, nil)
		s.store.listen(f.beatChannel(), f.hearBeat, func() {}, nil)
		e := engine.New(engine.Options{Clock: clk, Seed: uint64(100 + len(s.engs)), Fleet: f})
		s.fleets[i], s.engs[i], s.sets[i] = f, e, compile(e)
		f.round() // at once, as newFleet's loop does
	}
	return s
}

func (s *fleetSim) at(t time.Time, do func()) {
	s.seq++
	cheap.Push(&s.events, simEvent{t, s.seq, do})
}

func (s *fleetSim) every(t time.Time, d time.Duration, do func()) {
	s.at(t, func() {
		do()
		s.every(t.Add(d), d, do)
	})
}

// run runs the events until end.
func (s *fleetSim) run(end time.Time) {
	for s.events.Len() > 0 && !s.events[0].at.After(end) {
		ev := cheap.Pop(&s.events).(simEvent)
		s.clk.Set(ev.at)
		ev.do()
	}
	s.clk.Set(end)
}

// admits decides n requests of key on replica i (as decide) and returns
// how many were admitted.
func (s *fleetSim) admits(i int, key string, n int) int {
	a := 0
	for range n {
		if s.decide(i, key) {
			a++
		}
	}
	return a
}

// decide decides one request of key on replica i (-1: the replica alone).
func (s *fleetSim) decide(i int, key string) bool {
	e, set := s.alone, s.one
	if i >= 0 {
		e, set = s.engs[i], s.sets[i]
	}
	s.sc.Reset()
	facts := [1]engine.Fact{{Rule: set.Rules[0], Key: key}}
	d := e.Decide(context.Background(), set, s.clk.Now(), &engine.Request{Facts: facts[:], NoDrip: true}, &s.sc)
	d.Done()
	if i >= 0 {
		s.deliverSoon() // a claim's send published it
	}
	if i >= 0 && len(s.fleets[i].pend) > 0 && !s.queued[i] {
		// The sync goroutine wakes and sends them: a round trip later,
		// the reply is in; as much again, a claim reaches the others.
		s.queued[i] = true
		f := s.fleets[i]
		s.at(s.clk.Now().Add(s.rtt), func() {
			s.queued[i] = false
			if f.up.Load() {
				f.sendPending()
			}
			s.at(s.clk.Now().Add(s.rtt), s.store.deliver)
		})
	}
	return d.Admitted
}

// deliverSoon delivers what was published (claims, heartbeats) a round
// trip later.
func (s *fleetSim) deliverSoon() {
	s.store.mu.Lock()
	n := len(s.store.queued)
	s.store.mu.Unlock()
	if n > 0 && !s.delivering {
		s.delivering = true
		s.at(s.clk.Now().Add(s.rtt), func() {
			s.delivering = false
			s.store.deliver()
		})
	}
}

// tally is what a client's requests got, on the fleet and alone, in its
// first 10 s and after; wrong counts the requests the fleet refused that
// the replica alone admitted.
type tally struct {
	fleetFirst, aloneFirst, fleetAfter, aloneAfter, sent, wrong int
}

func (a *tally) add(b tally) {
	a.fleetFirst += b.fleetFirst
	a.aloneFirst += b.aloneFirst
	a.fleetAfter += b.fleetAfter
	a.aloneAfter += b.aloneAfter
	a.sent += b.sent
	a.wrong += b.wrong
}

func (a tally) ratios() (first, after float64) {
	return float64(a.fleetFirst) / float64(a.aloneFirst), float64(a.fleetAfter) / float64(a.aloneAfter)
}

// client sends key's requests from start to end, every gap with up to
// ±jitter/2 of it at random, to the replicas in turn (route picks the
// replica of the j-th request), and to the replica alone at the same
// instants, counting what each admits into tl.
func (s *fleetSim) client(key string, start, end time.Time, gap time.Duration, rng *rand.Rand, route func(j int) int, tl *tally) {
	var next func(j int, t time.Time)
	next = func(j int, t time.Time) {
		if !t.Before(end) {
			return
		}
		s.at(t, func() {
			first := s.clk.Now().Sub(start) < 10*time.Second
			tl.sent++
			got := s.decide(route(j), key)
			if got {
				if first {
					tl.fleetFirst++
				} else {
					tl.fleetAfter++
				}
			}
			want := s.decide(-1, key)
			if want {
				if first {
					tl.aloneFirst++
				} else {
					tl.aloneAfter++
				}
			}
			if want && !got {
				tl.wrong++
			}
			d := time.Duration(float64(gap) * (1 + 0.2*(rng.Float64()-0.5)))
			next(j+1, t.Add(d))
		})
	}
	next(0, start)
}

// fleetCase is one line of the table: a limit, N replicas behind
// a round-robin balancer, a client at x times the limit.
type fleetCase struct {
	requests float64
	per      time.Duration
	n        int
	x        float64
}

func (c fleetCase) String() string {
	return fmt.Sprintf("%g/%v N=%d %gx", c.requests, c.per, c.n, c.x)
}

// simulate runs c with keys clients, each starting at its own moment in
// the first tick and sending for 10 s plus after, and returns their tally.
func simulate(t testing.TB, c fleetCase, keys int, after time.Duration, sticky bool) tally {
	s := newFleetSim(t, c.n, rate.Rate{Requests: c.requests, Per: c.per}, c.n)
	rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.x*1000)))
	gap := time.Duration(float64(c.per) / (c.x * c.requests))
	tick := c.per / 2
	var tl tally
	t0 := s.clk.Now().Add(time.Second)
	for k := range keys {
		start := t0.Add(time.Duration(k) * tick / time.Duration(keys))
		route := func(j int) int { return (j + k) % c.n }
		if sticky {
			route = func(int) int { return k % c.n }
		}
		s.client(fmt.Sprint("client-", k), start, start.Add(10*time.Second+after), gap, rng, route, &tl)
	}
	s.run(t0.Add(tick + 10*time.Second + after + time.Second))
	return tl
}

// fleetLong reports whether the long fleet runs were asked for
// (SKETCHPROXY_FLEET_LONG=1): the whole table at full length here, and
// through real processes in cmd/sketchproxy.
func fleetLong() bool { return os.Getenv("SKETCHPROXY_FLEET_LONG") == "1" }

// The table on a manual clock: N replicas (2, 3, 5) behind a
// round-robin balancer admit within 5% of what one replica alone admits,
// over each client's first 10 s and after them, for limits from 1 a second
// to 1,000 a minute at 2x and 10x. Several clients a case, each on its own
// key from its own moment, so that the ratio is not one request's
// rounding: five, and 30 s (2 min for per-minute limits) after the first
// 10 s, with SKETCHPROXY_FLEET_LONG=1; else three, and a third of that
// after, where a case sends over 100 requests a second. Deterministic:
// the same admissions on every run and machine.
func TestFleetSimTable(t *testing.T) {
	limits := []struct {
		requests float64
		per      time.Duration
	}{{1, time.Second}, {10, time.Second}, {50, time.Second}, {20, time.Minute}, {1000, time.Minute}}
	replicas := []int{2, 3, 5}
	if testing.Short() && !fleetLong() {
		replicas = []int{3} // every limit and overload; make test-long runs 2 and 5 too
	}
	for _, l := range limits {
		for _, n := range replicas {
			for _, x := range []float64{2, 10} {
				c := fleetCase{l.requests, l.per, n, x}
				t.Run(c.String(), func(t *testing.T) {
					keys, after := 5, 30*time.Second
					if l.per == time.Minute {
						after = 2 * time.Minute
					}
					if !fleetLong() && l.requests*x*float64(time.Second)/float64(l.per) > 100 {
						keys, after = 3, after/3
					}
					tl := simulate(t, c, keys, after, false)
					first, later := tl.ratios()
					t.Logf("%v: first 10 s %d/%d (%.3f), after %d/%d (%.3f), %d sent", c, tl.fleetFirst, tl.aloneFirst, first, tl.fleetAfter, tl.aloneAfter, later, tl.sent)
					if tl.aloneFirst+tl.aloneAfter >= tl.sent {
						t.Fatalf("the replica alone refused nothing: the case measures no limit")
					}
					if first < 0.95 || first > 1.05 || later < 0.95 || later > 1.05 {
						t.Errorf("%v: the fleet admitted %.3f (first 10 s) and %.3f (after) of what one replica alone admits, want within 5%%", c, first, later)
					}
				})
			}
		}
	}
}

// A sticky balancer (each client always on one replica): the replica's
// demand makes its share the client's whole limit, and the fleet admits
// what one replica alone would; the first 10 s lose at most what the key's
// first rounds hold for the replicas not yet seen (2 intervals at the fair
// share).
func TestFleetSimSticky(t *testing.T) {
	for _, c := range []fleetCase{{10, time.Second, 3, 3}, {1, time.Second, 3, 3}, {1000, time.Minute, 3, 2}} {
		after := 30 * time.Second
		if c.per == time.Minute {
			after = 2 * time.Minute
		}
		tl := simulate(t, c, 3, after, true)
		first, later := tl.ratios()
		t.Logf("%v, sticky: first 10 s %d/%d (%.3f), after %d/%d (%.3f)", c, tl.fleetFirst, tl.aloneFirst, first, tl.fleetAfter, tl.aloneAfter, later)
		if first < 0.95 || first > 1.05 || later < 0.95 || later > 1.05 {
			t.Errorf("%v on a sticky balancer: %.3f and %.3f of one replica alone, want within 5%%", c, first, later)
		}
	}
}

// A replica leaves (its process ends): the others count each other again
// through the heartbeat, its record lapses (fleet.stale), and the shares
// are re-cut over the two that remain, which then admit what one replica
// alone would.
func TestFleetSimReplicaLeaves(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 10, Per: time.Second}, 0)
	rng := rand.New(rand.NewPCG(5, 6))
	t0 := s.clk.Now().Add(time.Second)
	leave := t0.Add(15 * time.Second)
	var before, after tally
	for k := range 3 {
		key := fmt.Sprint("client-", k)
		s.client(key, t0, leave, time.Second/30, rng, func(j int) int { return (j + k) % 3 }, &before)
		// From the leaving on, replicas 0 and 1 only; measured from 10 s
		// later (its record lapses in fleet.stale, 3 s).
		s.client(key, leave, leave.Add(40*time.Second), time.Second/30, rng, func(j int) int { return (j + k) % 2 }, &after)
	}
	s.at(leave, func() { s.gone[2] = true })
	s.run(leave.Add(41 * time.Second))
	if n := s.fleets[0].replicas(); n != 2 {
		t.Errorf("replica 0 counts %d replicas after one left, want 2", n)
	}
	b, _ := before.ratios()
	_, a := after.ratios() // after: its own first 10 s are the re-cut
	t.Logf("3 replicas: %d/%d (%.3f) in the first 10 s; after one left, from 10 s on: %d/%d (%.3f)", before.fleetFirst, before.aloneFirst, b, after.fleetAfter, after.aloneAfter, a)
	if a < 0.95 || a > 1.05 {
		t.Errorf("after a replica left, the two others admitted %.3f of one replica alone, want within 5%%", a)
	}
}

// Redis goes away for 10 s, then comes back empty: keys at 0.85x their
// limit are never refused (locally at θ/N while it is away; the replicas
// write their records whole again, the young key holding room for those
// not yet back), every replica sees that Redis lost its records once, and
// a key at 3x is held near its limit throughout.
func TestFleetSimRedisRestart(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 10, Per: time.Second}, 3)
	rng := rand.New(rand.NewPCG(7, 8))
	t0 := s.clk.Now().Add(time.Second)
	end := t0.Add(40 * time.Second)
	var steady, heavy tally
	for k := range 6 {
		s.client(fmt.Sprint("steady-", k), t0, end, time.Second*2/17, rng, func(j int) int { return (j + k) % 3 }, &steady)
	}
	s.client("heavy", t0, end, time.Second/30, rng, func(j int) int { return j % 3 }, &heavy)
	s.at(t0.Add(15*time.Second), func() { s.store.down = true })
	s.at(t0.Add(25*time.Second), func() { s.store.flush(); s.store.down = false })
	s.run(end)
	var resends uint64
	for _, f := range s.fleets {
		resends += f.resends.Load()
	}
	_, h := heavy.ratios()
	t.Logf("keys at 0.85x: %d of %d refused where one replica alone admits; the key at 3x: %.3f of one replica alone after its first 10 s; Redis found empty by %d replicas", steady.wrong, steady.sent, h, resends)
	if steady.wrong != 0 {
		t.Errorf("%d requests of keys at 0.85x their limit refused", steady.wrong)
	}
	if resends != 3 {
		t.Errorf("Redis found empty %d times, want once by each of 3 replicas", resends)
	}
	if h < 0.9 || h > 1.1 {
		t.Errorf("the key at 3x got %.3f of one replica alone through the outage and the restart, want within 10%%", h)
	}
}

// A wallet shared by a fleet is spent as one replica alone spends it: its
// check and its charge go through the same shares as a limit's count.
func TestFleetSimWallet(t *testing.T) {
	for _, n := range []int{2, 3} {
		s := newFleetSimRule(t, n, engine.RuleSpec{Name: "llm", Budget: &engine.BudgetSpec{Name: "b", Units: 20, Per: time.Second, Unit: 1, Cost: 1, Reserve: 1}}, n)
		rng := rand.New(rand.NewPCG(9, uint64(n)))
		var tl tally
		t0 := s.clk.Now().Add(time.Second)
		for k := range 3 {
			s.client(fmt.Sprint("tenant-", k), t0.Add(time.Duration(k)*100*time.Millisecond), t0.Add(40*time.Second), time.Second/60, rng, func(j int) int { return (j + k) % n }, &tl)
		}
		s.run(t0.Add(41 * time.Second))
		first, after := tl.ratios()
		t.Logf("N=%d, a wallet of 20 units a second spent at 3x: first 10 s %d/%d (%.3f), after %d/%d (%.3f)", n, tl.fleetFirst, tl.aloneFirst, first, tl.fleetAfter, tl.aloneAfter, after)
		if tl.aloneFirst+tl.aloneAfter >= tl.sent {
			t.Fatal("the replica alone refused nothing")
		}
		if first < 0.95 || first > 1.05 || after < 0.95 || after > 1.05 {
			t.Errorf("N=%d: a fleet's wallet admitted %.3f and %.3f of one replica alone, want within 5%%", n, first, after)
		}
	}
}

// A wallet's burst at a key's birth: 20 units a minute, a unit a call, 20,
// 30 and 100 calls in 100 ms round robin over 3 replicas. Wallets do not
// claim (the engine checks them against what requests in flight
// reserve): each replica decides from its view and tells the others at
// once past what Redis holds for it. A quiet share of the pool spent
// first, without a word, admitted 21 to 24 of 20; now every count past
// the guarantee is told, and the others hear it a publish later (the
// sim's round trip, 1 ms, as far apart as the 100 calls): 20 to 21.
func TestFleetSimWalletBurstAtBirth(t *testing.T) {
	for _, calls := range []int{20, 30, 100} {
		rs := engine.RuleSpec{Name: "llm", Budget: &engine.BudgetSpec{Name: "b", Units: 20, Per: time.Minute, Unit: 1, Cost: 1, Reserve: 1}}
		for k, tl := range burstsAtBirth(t, rs, calls, nil) {
			t.Logf("%d calls in 100 ms, wallet %d: the fleet admitted %d of %d, one replica alone %d; %d refused where one alone admits", calls, k, tl.fleetFirst, tl.sent, tl.aloneFirst, tl.wrong)
			if tl.aloneFirst != 20 {
				t.Fatalf("one replica alone admitted %d of %d, want 20: the case measures no burst", tl.aloneFirst, tl.sent)
			}
			if tl.wrong > 0 {
				t.Errorf("%d calls, wallet %d: %d requests refused that one replica alone admits", calls, k, tl.wrong)
			}
			if float64(tl.fleetFirst) > 1.05*float64(tl.aloneFirst) {
				t.Errorf("%d calls, wallet %d: 3 replicas admitted %d of a burst of %d, more than 5%% over", calls, k, tl.fleetFirst, tl.aloneFirst)
			}
		}
	}
}

// A reload that changes a limit but keeps its rule's and limit's names
// (20 a second becomes 5) decides a key the fleet already shares by the
// new limit at once: its hot entry counted the old sketch's key, and kept
// syncing it until the key cooled. The entry is replaced, and the new
// limit's record in Redis is another (redisKeys hashes tick and threshold).
func TestFleetReloadChangesLimit(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	store := newMemStore(clk.Now)
	cfg := &config.FleetConfig{Replicas: 2, ID: "r0", Interval: config.Duration(500 * time.Millisecond),
		Timeout: config.Duration(250 * time.Millisecond), PromoteFraction: 0.5, MaxHot: 10000, Prefix: "sketchproxy:", WalletOnFailure: "closed"}
	f := newFleetOn(cfg, []byte("0123456789abcdef"), store, slog.New(slog.NewTextHandler(io.Discard, nil)), clk.Now)
	e := engine.New(engine.Options{Clock: clk, Seed: 1, Fleet: f})
	spec := func(requests float64) *engine.Spec {
		return &engine.Spec{
			Buckets: 1 << 10, Rules: []engine.RuleSpec{{Name: "api", Limits: []engine.LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: requests, Per: time.Second}}}}},
			Tarpit:  engine.TarpitSpec{BanFor: time.Minute, MaxHeld: 1, MaxHeldPerKey: 1},
			NewKeys: engine.NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
		}
	}
	decide := func(set *engine.Set) bool {
		var sc engine.Scratch
		facts := [1]engine.Fact{{Rule: set.Rules[0], Key: "k"}}
		d := e.Decide(context.Background(), set, clk.Now(), &engine.Request{Facts: facts[:]}, &sc)
		d.Done()
		return d.Admitted
	}
	old, err := e.Compile(spec(20), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 8 {
		decide(old) // past half of the fair share of 20: shared
		f.round()
	}
	if f.count.Load() != 1 {
		t.Fatalf("%d hot keys after 8 requests of a 20-a-second key on 2 replicas, want 1", f.count.Load())
	}
	cur, err := e.Compile(spec(5), old)
	if err != nil {
		t.Fatal(err)
	}
	e.Retire(old, cur)
	defer e.Retire(cur, nil)
	admitted := 0
	for range 10 {
		if decide(cur) {
			admitted++
		}
		f.round()
	}
	// The new limit's fair share on 2 replicas, from a fresh count: at
	// most its burst of 5, never the old limit's room.
	if admitted == 0 || admitted > 5 {
		t.Errorf("after the reload to 5 a second, %d of 10 admitted at once, want 1 to 5", admitted)
	}
	if f.count.Load() != 1 {
		t.Errorf("%d hot keys after the reload, want the one entry, replaced", f.count.Load())
	}
	for i := range f.shards {
		for _, h := range f.shards[i].m {
			if h.theta != 10 {
				t.Errorf("the hot entry shares a limit of threshold %d after the reload to 5 a second (10)", h.theta)
			}
		}
	}
}

// Bursts at a key's birth, on the manual clock: 16, 20 and 30 calls in
// 100 ms round robin over 3 replicas at 20 a minute (a burst of 20), each
// for 5 fresh keys. Each replica spent its quiet share of a key just
// shared from a view of another moment, and claimed the pool's last room
// loudly while another did: 22 to 24 of 30 before claims (docs/fleets.md,
// A key just shared). Holding each other replica at its quiet share held
// it to 20 but refused 1 to 6 of a burst of 16 or 20 that one replica
// alone admits: the wrong direction. The test pins both sides: a burst
// within the limit is never refused, and one past it is held to the
// burst; where refused requests count too (the engine asks the fleet with
// the count before the request's hits); and where a writer without the
// secret rewrites every key's born (unsigned) to long ago, so that Redis
// calls a key just shared old: a key's youth is this replica's own word
// (22 to 24 of 30 before it was).
func TestFleetSimBurstAtBirth(t *testing.T) {
	for _, c := range []struct {
		calls               int
		countRefused, forge bool
	}{{16, false, false}, {20, false, false}, {30, false, false}, {20, true, false}, {30, true, false}, {20, false, true}, {30, false, true}, {30, true, true}} {
		calls := c.calls
		rs := engine.RuleSpec{Name: "api", CountRefused: c.countRefused, Limits: []engine.LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 20, Per: time.Minute}}}}
		for k, tl := range burstsAtBirth(t, rs, calls, func(s *fleetSim) { s.store.oldBorn = c.forge }) {
			t.Logf("%d calls in 100 ms (refused ones counted: %v, born forged: %v), key %d: the fleet admitted %d of %d, one replica alone %d; %d refused where one alone admits", calls, c.countRefused, c.forge, k, tl.fleetFirst, tl.sent, tl.aloneFirst, tl.wrong)
			if tl.aloneFirst != min(tl.sent, 20) {
				t.Fatalf("one replica alone admitted %d of %d, want %d: the case measures no burst", tl.aloneFirst, tl.sent, min(tl.sent, 20))
			}
			if tl.wrong > 0 {
				t.Errorf("%d calls, key %d: %d requests refused that one replica alone admits", calls, k, tl.wrong)
			}
			if tl.fleetFirst > tl.aloneFirst {
				t.Errorf("%d calls, key %d: 3 replicas admitted %d of a burst of %d, more than the burst", calls, k, tl.fleetFirst, tl.aloneFirst)
			}
		}
	}
}

// Bursts at the birth of keys of a limit whose fair share θ/N holds no
// whole request: 1 a second over 3 replicas (θ one request), where every
// key is shared from its first request. Such limits did not claim (a
// claim Redis refused stayed in its record, and held the whole limit
// until it halved), and each replica admitted a new key's first request
// alone: 2 to 3 of a burst of 1 where the calls come within a round trip
// to Redis (5 ms here: 3 and 10 calls in 10 ms). Claims are conditional
// now (the script writes one only where it fits): the burst, and a
// client under its limit (one request every 1.2 s, spread) is never
// refused.
func TestFleetSimBurstAtBirthSmallLimit(t *testing.T) {
	for _, calls := range []int{3, 10} {
		rs := engine.RuleSpec{Name: "api", Limits: []engine.LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 1, Per: time.Second}}}}
		s := newFleetSimRule(t, 3, rs, 0)
		s.rtt = 5 * time.Millisecond
		rng := rand.New(rand.NewPCG(47, uint64(calls)))
		t0 := s.clk.Now().Add(2 * time.Second)
		var tallies [5]tally
		for k := range tallies {
			start := t0.Add(time.Duration(k) * 3 * time.Second)
			s.client(fmt.Sprint("small-", k), start, start.Add(10*time.Millisecond), 10*time.Millisecond/time.Duration(calls), rng, func(j int) int { return j % 3 }, &tallies[k])
		}
		var calm tally
		s.client("calm", t0, t0.Add(20*time.Second), 1200*time.Millisecond, rng, func(j int) int { return j % 3 }, &calm)
		s.run(t0.Add(25 * time.Second))
		for k, tl := range tallies {
			t.Logf("%d calls in 10 ms at 1 a second over 3 replicas, key %d: the fleet admitted %d of %d, one replica alone %d", calls, k, tl.fleetFirst, tl.sent, tl.aloneFirst)
			if tl.aloneFirst != 1 {
				t.Fatalf("one replica alone admitted %d, want the burst of 1: the case measures no burst", tl.aloneFirst)
			}
			if tl.fleetFirst > tl.aloneFirst {
				t.Errorf("%d calls, key %d: 3 replicas admitted %d of a burst of %d", calls, k, tl.fleetFirst, tl.aloneFirst)
			}
		}
		t.Logf("a client under its limit: %d of %d refused where one replica alone admits", calm.wrong, calm.sent)
		if calm.wrong > 0 {
			t.Errorf("%d of %d requests of a client under its limit refused where one replica alone admits them", calm.wrong, calm.sent)
		}
	}
}

// A request another limit refuses after its claim leaves the count it
// claimed in the record, and the next request of the key on that replica
// takes it without a send: claims do not pile up past what was admitted
// (15 claims for 5 admissions in a review of a first try). 30 calls in
// 100 ms over 3 replicas under a rule of two limits, 20 and 6 a minute:
// the second refuses past 6 at evaluation, after the first was claimed.
func TestFleetSimClaimsDoNotPileUp(t *testing.T) {
	rs := engine.RuleSpec{Name: "api", Limits: []engine.LimitSpec{
		{Name: "wide", Rate: rate.Rate{Requests: 20, Per: time.Minute}},
		{Name: "tight", Rate: rate.Rate{Requests: 6, Per: time.Minute}},
	}}
	s := newFleetSimRule(t, 3, rs, 0)
	rng := rand.New(rand.NewPCG(47, 30))
	t0 := s.clk.Now().Add(2 * time.Second)
	var tl tally
	s.client("piling", t0, t0.Add(100*time.Millisecond), 100*time.Millisecond/30, rng, func(j int) int { return j % 3 }, &tl)
	s.run(t0.Add(2 * time.Second))
	var claims uint64
	for _, f := range s.fleets {
		claims += f.claims.Load()
	}
	t.Logf("30 calls in 100 ms, limits of 20 and 6 a minute: the fleet admitted %d (one replica alone %d); %d claims published", tl.fleetFirst, tl.aloneFirst, claims)
	if tl.aloneFirst != 6 || tl.fleetFirst != 6 {
		t.Fatalf("admitted %d, one replica alone %d, want 6 and 6", tl.fleetFirst, tl.aloneFirst)
	}
	// Each admission claims in both limits; a refused request claims once
	// more per replica in the wide limit at most, as its claim is then
	// the next request's.
	if most := uint64(2*tl.fleetFirst + 2*3); claims > most {
		t.Errorf("%d claims for %d admissions over 3 replicas, want at most %d: claims pile up", claims, tl.fleetFirst, most)
	}
}

// What a one-off key of a limit whose θ/N holds no whole request costs
// Redis (every key of such a limit is shared from its first request):
// 60 keys of 1 a second, each sent once, one every 100 ms round robin
// over 3 replicas. Each is claimed at its request (the script writes it,
// and publishes it) and then sent at each round until it cools.
func TestFleetSimOneOffSmallLimitCost(t *testing.T) {
	s := newFleetSim(t, 3, rate.Rate{Requests: 1, Per: time.Second}, 0)
	t0 := s.clk.Now().Add(2 * time.Second)
	s.run(t0)
	var before, claims [3]uint64
	for i, f := range s.fleets {
		before[i], claims[i] = f.commands.Load(), f.claims.Load()
	}
	const keys = 60
	admitted := 0
	for k := range keys {
		at := t0.Add(time.Duration(k) * 100 * time.Millisecond)
		s.at(at, func() {
			if s.decide(k%3, fmt.Sprint("once-", k)) {
				admitted++
			}
		})
	}
	s.run(t0.Add(keys*100*time.Millisecond + 10*time.Second))
	var cmds, published uint64
	for i, f := range s.fleets {
		cmds += f.commands.Load() - before[i]
		published += f.claims.Load() - claims[i]
	}
	t.Logf("%d one-off keys of 1 a second over 3 replicas: %d admitted, %.1f script calls and %.1f claims published a key", keys, admitted, float64(cmds)/keys, float64(published)/keys)
	if admitted != keys {
		t.Errorf("%d of %d one-off keys admitted: each is under its limit", admitted, keys)
	}
	if cmds > 5*keys {
		t.Errorf("%d script calls for %d one-off keys, more than 5 a key", cmds, keys)
	}
}

// What a heavy key's claims cost: 2 clients each at 2x and 10x limits of
// short and long ticks, round robin over 3 replicas, for 60 s. A request
// past its replica's guarantee claims and waits (no quiet share of the
// pool: share.go), and the guarantees follow the replicas' demand, which
// is known a tick late: through a long tick's first (30 s at a limit a
// minute) about one admitted request in two claims (0.46 and 0.50 at
// 1,000 a minute, 0.56 at 20; 0.06, 0.12 and 0.22 with a quiet share of
// the pool), against 0.05 and less at 10 and 50 a second. Never more than
// one claim a request admitted.
func TestFleetSimHeavyClaimCost(t *testing.T) {
	for _, c := range []fleetCase{{20, time.Minute, 3, 2}, {1000, time.Minute, 3, 2}, {1000, time.Minute, 3, 10}, {10, time.Second, 3, 2}, {50, time.Second, 3, 10}} {
		s := newFleetSim(t, c.n, rate.Rate{Requests: c.requests, Per: c.per}, c.n)
		rng := rand.New(rand.NewPCG(uint64(c.n), uint64(c.x*1000)))
		gap := time.Duration(float64(c.per) / (c.x * c.requests))
		var tl tally
		t0 := s.clk.Now().Add(time.Second)
		for k := range 2 {
			s.client(fmt.Sprint("heavy-", k), t0, t0.Add(60*time.Second), gap, rng, func(j int) int { return (j + k) % c.n }, &tl)
		}
		s.run(t0.Add(61 * time.Second))
		var claims uint64
		for _, f := range s.fleets {
			claims += f.Stats().Claims
		}
		admitted := tl.fleetFirst + tl.fleetAfter
		t.Logf("%v: %d of %d admitted, %d claims published (%.3f a request admitted)", c, admitted, tl.sent, claims, float64(claims)/float64(admitted))
		if admitted >= tl.sent {
			t.Fatalf("%v: the fleet refused none of %d requests: the limit never ran", c, tl.sent)
		}
		if claims > uint64(admitted) {
			t.Errorf("%v: %d claims for %d requests admitted: more than one a request", c, claims, admitted)
		}
	}
}

// burstsAtBirth sends 5 fresh keys of rule rs calls requests each in
// 100 ms, round robin over 3 replicas that have counted each other
// (setup, if not nil, sets the fleet sim up first), a second apart, and
// returns what each got.
func burstsAtBirth(t *testing.T, rs engine.RuleSpec, calls int, setup func(s *fleetSim)) [5]tally {
	t.Helper()
	s := newFleetSimRule(t, 3, rs, 0)
	if setup != nil {
		setup(s)
	}
	rng := rand.New(rand.NewPCG(47, uint64(calls)))
	t0 := s.clk.Now().Add(2 * time.Second) // each heartbeat has counted the 3
	var tallies [5]tally
	for k := range tallies {
		start := t0.Add(time.Duration(k) * time.Second)
		gap := 100 * time.Millisecond / time.Duration(calls)
		s.client(fmt.Sprint("burst-", k), start, start.Add(100*time.Millisecond), gap, rng, func(j int) int { return j % 3 }, &tallies[k])
	}
	s.run(t0.Add(10 * time.Second))
	return tallies
}
