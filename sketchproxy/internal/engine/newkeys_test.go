package engine

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// newKeysRule is an engine with one rule of 4 requests a minute and the
// new-key defence at its defaults, with a warm-up of 45 s.
func newKeysRule(t testing.TB) (*Engine, *Set, *epochsketch.ManualClock) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	e := New(Options{Clock: clk, Seed: 1})
	s, err := e.Compile(&Spec{
		Buckets: 1 << 14,
		Rules:   []RuleSpec{{Name: "api", Limits: []LimitSpec{{Name: "rate", Rate: rate.Rate{Requests: 4, Per: time.Minute}}}}},
		NewKeys: NewKeysSpec{SpikeFactor: 4, MinPerSecond: 50, BudgetFactor: 0.25, Window: time.Minute, Remember: time.Hour, Warmup: 45 * time.Second},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Retire(s, nil) })
	return e, s, clk
}

// keyLoad sends new keys on a manual clock, a second at a time, and counts
// what the engine admits.
type keyLoad struct {
	e        *Engine
	s        *Set
	clk      *epochsketch.ManualClock
	sc       Scratch
	n        int // keys made so far
	admitted int
	sent     int
}

// second sends n new keys spread evenly over one second, each making per
// requests at once (a rotation's keys), then the returning keys' requests
// (each once, at the end of the second), and advances the clock a second.
func (l *keyLoad) second(n, per int, returning ...string) {
	gap := time.Second / time.Duration(n+len(returning)+1)
	for range n {
		l.n++
		key := fmt.Sprint("new", l.n)
		for range per {
			l.sent++
			if decide(l.e, l.s, key, &l.sc) {
				l.admitted++
			}
		}
		l.clk.Advance(gap)
	}
	for _, key := range returning {
		l.sent++
		if decide(l.e, l.s, key, &l.sc) {
			l.admitted++
		}
		l.clk.Advance(gap)
	}
	l.clk.Advance(time.Second - gap*time.Duration(n+len(returning)))
}

// share is the admitted share since the last call.
func (l *keyLoad) share() float64 {
	s := float64(l.admitted) / float64(l.sent)
	l.admitted, l.sent = 0, 0
	return s
}

// A ramp of new keys meets the defence as a flat spike does: 45 s at 40
// new keys a second, then 40 a second growing 8.4% a second to 300, then
// 10 s at 300, each key making 4 requests of a 4-a-minute limit at once.
// A baseline that learns from every new key follows such a ramp (its
// moving average stays within the spike factor of it) and admits all of
// the ramp's requests. Capped at twice a window, the baseline falls behind
// within 17 s: the ramp's keys until then (under 4 times the average, no
// spike by definition) get whole limits, every key after a quarter, and
// the same keys at 300 a second at once a quarter from their first second.
func TestNewKeysRampIsASpike(t *testing.T) {
	calm := func(l *keyLoad) {
		for range 45 {
			l.second(40, 4)
		}
		l.share()
	}
	e, s, clk := newKeysRule(t)
	ramp := &keyLoad{e: e, s: s, clk: clk}
	calm(ramp)
	keys := 0
	for t := 0; ; t++ {
		n := min(300, int(math.Round(40*math.Pow(1.084, float64(t)))))
		ramp.second(n, 4)
		keys += n
		if n == 300 {
			break
		}
	}
	for range 10 {
		ramp.second(300, 4)
		keys += 300
	}
	sent := ramp.sent
	rampShare := ramp.share()

	e, s, clk = newKeysRule(t)
	flat := &keyLoad{e: e, s: s, clk: clk}
	calm(flat)
	for left := keys; left > 0; left -= 300 {
		flat.second(min(left, 300), 4)
	}
	flatShare := flat.share()
	t.Logf("%d requests of %d new keys: a ramp has %.1f%% admitted, a flat spike %.1f%%", sent, keys, 100*rampShare, 100*flatShare)
	if rampShare > 0.5 || flatShare > 0.3 {
		t.Errorf("the ramp had %.1f%% admitted, a flat spike %.1f%%: want at most 50%% and 30%%", 100*rampShare, 100*flatShare)
	}
}

// client is a real client: its key and the requests it has made.
type client struct {
	key string
	n   int
}

// returning sends the requests of the real clients due in second sec, as
// sched holds them, at the clock's now, and schedules each one's next
// request every seconds later, up to n requests in all. It counts a
// client's first two requests in early, the rest in late (admitted, sent).
func returning(l *keyLoad, sched map[int][]*client, sec, every, n int, early, late *[2]int) {
	for _, c := range sched[sec] {
		st := early
		if c.n >= 2 {
			st = late
		}
		st[1]++
		if decide(l.e, l.s, c.key, &l.sc) {
			st[0]++
		}
		if c.n++; c.n < n {
			sched[sec+every] = append(sched[sec+every], c)
		}
	}
	delete(sched, sec)
}

// A flood of one-request keys, all admitted, is a spike for as long as it
// lasts: the baseline learns none of its keys, which never come back. A
// real new client during it gets a quarter of the limit at first and its
// whole limit once it comes back after a quarter to half a window: from
// its third request (40 s) on, none is refused.
func TestNewKeysFloodSparesReturningClients(t *testing.T) {
	e, s, clk := newKeysRule(t)
	l := &keyLoad{e: e, s: s, clk: clk}
	for range 45 {
		l.second(40, 1)
	}
	l.share()
	// 3 minutes of 300 one-request keys a second; for the first minute, 2
	// real clients arrive each second, at 3 a minute for 2 minutes.
	sched := map[int][]*client{}
	var early, late [2]int
	for sec := range 180 {
		if sec < 60 {
			for c := range 2 {
				sched[sec] = append(sched[sec], &client{key: fmt.Sprintf("real%d-%d", sec, c)})
			}
		}
		l.second(300, 1)
		returning(l, sched, sec, 20, 6, &early, &late)
	}
	if spike, _, _ := e.Spiking(s, clk.Now()); !spike {
		t.Error("3 minutes of 300 one-request keys a second were learned: no spike")
	}
	if share := l.share(); share != 1 {
		t.Errorf("the flood's one-request keys: %.3f admitted, want all", share)
	}
	t.Logf("real clients during the flood: first two requests %v, later ones %v (admitted, sent)", early, late)
	if late[0] != late[1] {
		t.Errorf("real clients refused %d of %d requests after they came back", late[1]-late[0], late[1])
	}
}

// Real clients growing faster than the baseline may follow (8.4% a second,
// from 40 to 300 new clients a second, each back every 20 s for 2
// minutes) are a spike at first, but they prove real by coming back and
// the baseline learns them: within a few windows no spike is left and new
// clients get whole limits again.
func TestNewKeysRealGrowthIsLearned(t *testing.T) {
	e, s, clk := newKeysRule(t)
	l := &keyLoad{e: e, s: s, clk: clk}
	sched := map[int][]*client{}
	var early, late [2]int
	n := 0
	arrive := func(sec, k int) {
		for range k {
			n++
			sched[sec] = append(sched[sec], &client{key: fmt.Sprint("real", n)})
		}
	}
	spikeFor := 0
	for sec := range 45 + 26 + 360 {
		k := 40
		if sec >= 45 {
			k = min(300, int(math.Round(40*math.Pow(1.084, float64(sec-45)))))
		}
		arrive(sec, k)
		returning(l, sched, sec, 20, 6, &early, &late)
		clk.Advance(time.Second)
		if spike, _, _ := e.Spiking(s, clk.Now()); spike {
			spikeFor++
			if sec > 45+26+240 {
				t.Fatalf("still a spike %d s after real clients reached 300 new a second", sec-45-26)
			}
		}
	}
	t.Logf("a spike for %d s; first two requests %v, later ones %v (admitted, sent)", spikeFor, early, late)
	if spikeFor == 0 {
		t.Error("growth of 8.4% a second was no spike: the baseline followed it")
	}
	// A few marks read high in the marks' sketch (4,096 buckets for 300
	// marks a second): at most 1 in 1,000.
	if refused := late[1] - late[0]; refused*1000 > late[1] {
		t.Errorf("real clients refused %d of %d requests after they came back", refused, late[1])
	}
	// The last minute's new clients, all past the spike, were refused nothing.
	early = [2]int{}
	for sec := 431; sec < 491; sec++ {
		arrive(sec, 300)
		returning(l, sched, sec, 20, 6, &early, &late)
		clk.Advance(time.Second)
	}
	if early[0] != early[1] {
		t.Errorf("after the spike, new clients' first requests: %d of %d admitted", early[0], early[1])
	}
}
