package engine

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// holdingFleet holds room for every request that adds (as a fleet's claim
// on a key just shared does) and records what the engine settles.
type holdingFleet struct {
	mu      sync.Mutex
	held    map[string]int // answers held, not yet settled, by key
	settled []string       // "key counted" / "key refused", in order
	queries []Query
}

func newHoldingFleet() *holdingFleet { return &holdingFleet{held: map[string]int{}} }

func (f *holdingFleet) Estimate(q Query) Answer {
	f.mu.Lock()
	defer f.mu.Unlock()
	q.Key = append([]byte(nil), q.Key...)
	f.queries = append(f.queries, q)
	if q.Add == 0 || q.Counted || q.Wallet {
		return Answer{Est: q.Count}
	}
	if q.Unconditional {
		return Answer{Est: q.Count}
	}
	f.held[string(q.Key)]++
	return Answer{Est: q.Count, Hold: 7}
}

func (f *holdingFleet) Counted([]byte) {}

func (f *holdingFleet) Settle(k []byte, hold, add uint32, counted bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if hold != 7 {
		panic("a hold the fleet never gave")
	}
	f.held[string(k)]--
	what := " refused"
	if counted {
		what = " counted"
	}
	f.settled = append(f.settled, string(k[len(k)-1:])+what)
}

func (f *holdingFleet) WalletsClosed() (bool, time.Duration) { return false, 0 }

// open reports the answers held and never settled.
func (f *holdingFleet) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.held {
		n += c
	}
	return n
}

func fleetEngine(t *testing.T, f Fleet, sleep func(context.Context, time.Duration) error, rs ...RuleSpec) (*Engine, *Set) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	e := New(Options{Clock: clk, Seed: 1, Fleet: f, Sleep: sleep})
	s, err := e.Compile(&Spec{
		Buckets: 1 << 10, Rules: rs,
		Tarpit:  TarpitSpec{DelayAbove: 0.5, DripAbove: 1.5, RejectAbove: 2, BanAbove: 8, BanFor: 10 * time.Minute, MaxHeld: 256, MaxHeldPerKey: 2, MaxDelay: time.Second},
		NewKeys: NewKeysSpec{Disabled: true, Window: time.Minute, Remember: time.Hour},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Retire(s, nil) })
	return e, s
}

// Every answer a fleet holds room for is settled once, whatever becomes of
// the request: counted when admitted, not counted when a limit, another
// rule or the conditional add refuses it, or when its client leaves while
// the tarpit holds it. A held room never settled would be room a fleet
// holds for nothing (docs/fleets.md, A key just shared).
func TestFleetHeldRoomSettled(t *testing.T) {
	lim := func(n float64) []LimitSpec {
		return []LimitSpec{{Name: "a", Rate: rate.Rate{Requests: n, Per: time.Minute}}, {Name: "b", Rate: rate.Rate{Requests: 100, Per: time.Minute}}}
	}
	f := newHoldingFleet()
	e, s := fleetEngine(t, f, nil, RuleSpec{Name: "wide", Limits: lim(100)}, RuleSpec{Name: "tight", Limits: lim(2)})
	var sc Scratch
	run := func(key string) bool {
		sc.Reset()
		facts := []Fact{{Rule: s.Rules[0], Key: key}, {Rule: s.Rules[1], Key: key}}
		d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts}, &sc)
		d.Done()
		return d.Admitted
	}
	var admitted int
	for range 5 {
		if run("k") {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("admitted %d of 5 under a limit of 2: the case measures no refusal", admitted)
	}
	if n := f.open(); n != 0 {
		t.Errorf("%d held answers never settled", n)
	}
	counted, refused := 0, 0
	for _, s := range f.settled {
		if s[2:] == "counted" {
			counted++
		} else {
			refused++
		}
	}
	// 2 admitted: 4 limits counted each; 3 refused: the wide rule's 2
	// limits, and the tight rule's b (its a refused it at evaluation, so
	// it was held too and not counted).
	if counted != 2*4 || refused != 3*4 {
		t.Errorf("settled %d counted and %d refused, want %d and %d: %v", counted, refused, 2*4, 3*4, f.settled)
	}
	for _, q := range f.queries {
		if q.Add > 0 && q.Start == nil {
			t.Fatalf("a query that adds has no Start: the fleet cannot bound the request's wait")
		}
	}
}

// A client that leaves while the tarpit holds it settles what the fleet
// held, as not counted.
func TestFleetHeldRoomSettledWhenGone(t *testing.T) {
	f := newHoldingFleet()
	gone := func(context.Context, time.Duration) error { return errors.New("gone") }
	e, s := fleetEngine(t, f, gone, RuleSpec{Name: "api", Tarpit: true, Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 4, Per: time.Minute}}}})
	var sc Scratch
	var sawGone bool
	for range 8 {
		sc.Reset()
		facts := []Fact{{Rule: s.Rules[0], Key: "k"}}
		d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts}, &sc)
		d.Done()
		sawGone = sawGone || d.Gone
	}
	if !sawGone {
		t.Fatal("no request was held by the tarpit: the case measures nothing")
	}
	if n := f.open(); n != 0 {
		t.Errorf("%d held answers never settled: %v", n, f.settled)
	}
}

// Where refused requests count, they count before the fleet is asked
// (Query.Counted): it holds nothing for them.
func TestFleetCountedQueries(t *testing.T) {
	f := newHoldingFleet()
	e, s := fleetEngine(t, f, nil, RuleSpec{Name: "api", CountRefused: true, Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 2, Per: time.Minute}}}})
	var sc Scratch
	for range 4 {
		decide(e, s, "k", &sc)
	}
	for _, q := range f.queries {
		if q.Add > 0 && !q.Counted {
			t.Fatalf("a query of a rule that counts refused requests was not marked Counted")
		}
	}
	if len(f.settled) != 0 || f.open() != 0 {
		t.Errorf("settled %v, open %d: nothing is held where requests count first", f.settled, f.open())
	}
}

// raceFleet answers below a promotion point of 4 counts with that point
// as the ceiling; past it, a full fleet. The first query of request "A"
// waits until request "B" was decided: B counts between A's answer and
// A's conditional add.
type raceFleet struct {
	mu      sync.Mutex
	asked   []uint32 // the counts queried, in order
	wait    chan struct{}
	waiting chan struct{}
}

func (f *raceFleet) Estimate(q Query) Answer {
	f.mu.Lock()
	f.asked = append(f.asked, q.Count)
	first := len(f.asked) == 2 // A's: the priming request was the first
	f.mu.Unlock()
	if first {
		close(f.waiting)
		<-f.wait
	}
	if q.Count+q.Add <= 4 {
		return Answer{Est: q.Count, Ceiling: 4}
	}
	return Answer{Est: q.Theta}
}
func (f *raceFleet) Counted([]byte)                       {}
func (f *raceFleet) Settle([]byte, uint32, uint32, bool)  {}
func (f *raceFleet) WalletsClosed() (bool, time.Duration) { return false, 0 }

// Requests in flight together that each read a count below the fleet's
// promotion point would pass it unseen (each replica's conditional add
// held the count only to θ: 90 requests started together over 3
// replicas admitted up to 30 of 20). The ceiling holds the add to the
// point, and a request that racing ones pushed past it asks the fleet
// again, with the count then.
func TestFleetCeilingAsksAgain(t *testing.T) {
	f := &raceFleet{wait: make(chan struct{}), waiting: make(chan struct{})}
	e, s := fleetEngine(t, f, nil, RuleSpec{Name: "api", Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 10, Per: time.Minute}}}})
	var sc Scratch
	if !decide(e, s, "k", &sc) {
		t.Fatal("the first request was refused")
	}
	done := make(chan bool)
	go func() {
		var sc Scratch
		done <- decide(e, s, "k", &sc) // A: waits in its first query
	}()
	<-f.waiting
	var scB Scratch
	if !decide(e, s, "k", &scB) { // B: takes the count to the point
		t.Fatal("B was refused below the promotion point")
	}
	close(f.wait)
	if <-done {
		t.Errorf("A was admitted past the fleet's ceiling: its count passed the promotion point unseen")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.asked); n < 4 || f.asked[n-1] != 4 {
		t.Errorf("queries %v: A was not asked again with the count B left (4)", f.asked)
	}
}

// A rule of more limits than a word has bits settles every hold.
func TestFleetHeldRoomSettledPast64Limits(t *testing.T) {
	var ls []LimitSpec
	for i := range 65 {
		ls = append(ls, LimitSpec{Name: "l" + strconv.Itoa(i), Rate: rate.Rate{Requests: float64(100 + i), Per: time.Minute}})
	}
	f := newHoldingFleet()
	e, s := fleetEngine(t, f, nil, RuleSpec{Name: "many", Limits: ls})
	var sc Scratch
	if !decide(e, s, "k", &sc) {
		t.Fatal("refused under 65 limits of 100 a minute and more")
	}
	if n := f.open(); n != 0 || len(f.settled) != 65 {
		t.Errorf("%d holds never settled, %d settled, want 0 and 65", n, len(f.settled))
	}
}

// Facts that count nothing ask as reads (Add 0), and rules that count
// whatever the answer say so (Unconditional): the fleet holds nothing for
// either.
func TestFleetQueriesOfUncountedFacts(t *testing.T) {
	f := newHoldingFleet()
	e, s := fleetEngine(t, f, nil,
		RuleSpec{Name: "shadow", Shadow: true, Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 10, Per: time.Minute}}}},
		RuleSpec{Name: "plain", Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 10, Per: time.Minute}}}})
	var sc Scratch
	sc.Reset()
	facts := []Fact{{Rule: s.Rules[0], Key: "k"}, {Rule: s.Rules[1], Key: "k", Negative: true, Hits: 3}}
	d := e.Decide(context.Background(), s, e.Now(), &Request{Facts: facts}, &sc)
	d.Done()
	for _, q := range f.queries {
		switch string(q.Key[:5]) {
		case "shado":
			if !q.Unconditional {
				t.Errorf("a shadow rule's query is not Unconditional")
			}
		case "plain":
			if q.Add != 0 {
				t.Errorf("a fact of negative hits asked with Add %d, want 0", q.Add)
			}
		}
	}
	if f.open() != 0 || len(f.settled) != 0 {
		t.Errorf("held %d, settled %v: nothing is held for facts that count nothing or whatever the answer", f.open(), f.settled)
	}
}
