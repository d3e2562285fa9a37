package sketchproxy

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// A Limiter given the same words as package limit's decides the same, on
// one timeline: a client at twice its limit, then four times, then quiet.
func TestLimiterAgreesWithPackageLimit(t *testing.T) {
	clk := epochsketch.NewManualClock(t0)
	l, err := NewLimiter(LimiterConfig{Requests: 5, Per: time.Second, Clock: clk, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := limit.NewWith(limit.Config{Requests: 5, Per: time.Second, Clock: clk, Seed: 1})
	defer p.Close()
	refused := 0
	for _, phase := range []struct {
		gap time.Duration
		n   int
	}{{100 * time.Millisecond, 100}, {50 * time.Millisecond, 200}, {time.Second, 5}} {
		for range phase.n {
			a, b := l.Decide("k", 1), p.Decide(time.Time{}, "k", 1)
			if a != b {
				t.Fatalf("at %v: Limiter %+v, package limit %+v", clk.Now().Sub(t0), a, b)
			}
			if !a.Allowed {
				refused++
			}
			clk.Advance(phase.gap)
		}
	}
	if refused == 0 {
		t.Fatal("nothing refused: the limit never ran")
	}
}

// Over random histories (gaps of 0 to 1.5 ticks, n from 0, a read, to
// Burst+1, which never fits), a Limiter's Decisions are package limit's,
// field by field: Remaining and Reset of a read and of a refusal included.
func TestLimiterAgreesOnEveryN(t *testing.T) {
	for seed := range uint64(20) {
		clk := epochsketch.NewManualClock(t0)
		cfg := LimiterConfig{Requests: 6, Per: time.Second, Burst: 4, Clock: clk, Seed: 1}
		l, err := NewLimiter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := limit.NewWith(limit.Config{Requests: 6, Per: time.Second, Burst: 4, Clock: clk, Seed: 1})
		rng := rand.New(rand.NewPCG(seed, 1))
		refused := 0
		for i := range 300 {
			n := rng.IntN(6)
			a, b := l.Decide("k", n), p.Decide(time.Time{}, "k", n)
			if a != b {
				t.Fatalf("seed %d, call %d (n=%d) at %v: Limiter %+v, package limit %+v", seed, i, n, clk.Now().Sub(t0), a, b)
			}
			if !a.Allowed {
				refused++
			}
			clk.Advance(time.Duration(rng.Int64N(int64(500 * time.Millisecond))))
		}
		l.Close()
		p.Close()
		if refused == 0 {
			t.Fatalf("seed %d: nothing refused: the limit never ran", seed)
		}
	}
}

func TestLimiterConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  LimiterConfig
		want string
	}{
		{LimiterConfig{Per: time.Second}, "Requests"},
		{LimiterConfig{Requests: 5}, "Per"},
		{LimiterConfig{Requests: 5, Per: time.Second, Burst: 1 << 24}, "Burst"},
	} {
		_, err := NewLimiter(c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "sketchproxy: LimiterConfig") {
			t.Errorf("%+v: %v, want an error naming %s", c.cfg, err, c.want)
		}
	}
}

// Two Limiters (two replicas: two processes as far as Redis knows) share
// one limit through a real redis-server: a client at 4 times its limit,
// its requests alternating between them, is admitted what one Limiter
// alone admits on the same schedule, within 5% (or one request), after a
// first burst. The wall clock drives it, as it drives a fleet's rounds:
// the rate achieved is measured, not assumed.
func TestLimiterFleetOverRedis(t *testing.T) {
	addr := testkit.RedisServer(t)
	newReplica := func(id string) *Limiter {
		l, err := NewLimiter(LimiterConfig{
			Requests: 20, Per: time.Second,
			Fleet: &FleetConfig{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: id, Replicas: 2, Interval: Duration(100 * time.Millisecond)},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	replicas := [2]*Limiter{newReplica("a"), newReplica("b")}
	// One replica alone, counting as a fleet counts (counts that halve at
	// each tick's end: docs/fleets.md), under a prefix of its own.
	alone, err := NewLimiter(LimiterConfig{
		Requests: 20, Per: time.Second,
		Fleet: &FleetConfig{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: "alone", Replicas: 1, Interval: Duration(100 * time.Millisecond), Prefix: "alone:"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	// 80 a second for 3 s: each request asks the fleet and the lone
	// Limiter at the same instant.
	fleet, one, sent := 0, 0, 0
	start := time.Now()
	for i := 0; time.Since(start) < 3*time.Second; i++ {
		if replicas[i%2].Allow("client") {
			fleet++
		}
		if alone.Allow("client") {
			one++
		}
		sent++
		time.Sleep(12500 * time.Microsecond)
	}
	t.Logf("%d requests in %v: the fleet admitted %d, one Limiter alone %d", sent, time.Since(start).Round(time.Millisecond), fleet, one)
	if one >= sent {
		t.Fatalf("one Limiter alone refused nothing of %d: the limit never ran", sent)
	}
	if d := math.Abs(float64(fleet - one)); d > 0.05*float64(one) && d > 1 {
		t.Errorf("two replicas admitted %d, one alone %d: more than 5%% apart", fleet, one)
	}
}
