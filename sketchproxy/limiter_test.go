package sketchproxy

import (
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
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
