package fleet

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// How far a replica's clock is off Redis's is reckoned from the replies:
// Redis ran a send between the replica's sending it and having the reply
// back, so a clock that agrees with Redis's reads 0 however slow a reply,
// and one off by a second reads that, to within the round trip, and is
// warned, again only after it fell under half that (docs/fleets.md,
// Clocks).
func TestFleetClockSkew(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	var logs strings.Builder
	f := hostileFleet(t, newMemStore(func() time.Time { return base }), func() time.Time { return base }, 0)
	f.log = slog.New(slog.NewTextHandler(&logs, nil))
	ms := func(d int64) int64 { return d * int64(time.Millisecond) }
	at := func(d time.Duration) int64 { return base.Add(d).UnixMicro() } // Redis's time, µs
	sent := base.UnixNano()
	for _, c := range []struct {
		name      string
		redis     time.Duration // Redis's time when it ran the send, from sent
		got       int64         // when the reply came, ns after sent
		skew, tol time.Duration // the skew wanted, within tol
		warned    int
	}{
		{"agrees, fast reply", 100 * time.Microsecond, ms(1), 0, 0, 0},
		{"agrees, slow reply", 150 * time.Millisecond, ms(240), 0, 0, 0},
		{"agrees, TIME rounded", -500 * time.Microsecond, ms(1), 0, 0, 0},
		{"50 ms ahead of Redis", -50 * time.Millisecond, ms(2), -50 * time.Millisecond, 2 * time.Millisecond, 0},
		{"a second ahead of Redis", -time.Second + time.Millisecond, ms(2), -time.Second, 2 * time.Millisecond, 1},
		{"then a slow reply", -time.Second + 100*time.Millisecond, ms(200), -time.Second, 2 * time.Millisecond, 1},
		{"two seconds behind Redis", 2*time.Second + time.Millisecond, ms(2), 2 * time.Second, 2 * time.Millisecond, 1},
		{"then agrees again", 30 * time.Millisecond, ms(60), 0, 30 * time.Millisecond, 1},
		{"a second ahead again: warned again", -time.Second + time.Millisecond, ms(2), -time.Second, 2 * time.Millisecond, 2},
	} {
		f.noteSkew(at(c.redis), sent, sent+c.got)
		got := f.Stats().ClockSkew
		if d := got - c.skew; d < -c.tol || d > c.tol {
			t.Errorf("%s: the skew reads %v, want %v within %v", c.name, got, c.skew, c.tol)
		}
		if n := strings.Count(logs.String(), "this replica's clock is"); n != c.warned {
			t.Errorf("%s: warned %d times, want %d:\n%s", c.name, n, c.warned, logs.String())
		}
	}
	if !strings.Contains(logs.String(), "clock is 999ms ahead of Redis's") {
		t.Errorf("the warning does not say how far and which way:\n%s", logs.String())
	}

	// A first reply that waited 400 ms on its dial, the clock 5 ms
	// behind Redis's: the least skew it shows, no warning.
	logs.Reset()
	g := hostileFleet(t, newMemStore(func() time.Time { return base }), func() time.Time { return base }, 0)
	g.log = slog.New(slog.NewTextHandler(&logs, nil))
	g.noteSkew(at(405*time.Millisecond), sent, sent+ms(400))
	if got := g.Stats().ClockSkew; got < 0 || got > 5*time.Millisecond || logs.Len() > 0 {
		t.Errorf("a slow first reply, the clock 5 ms behind: the skew reads %v, want 0 to 5 ms, and no warning:\n%s", got, logs.String())
	}
}
