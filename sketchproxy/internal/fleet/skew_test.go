package fleet

import (
	"testing"
	"time"
)

// A replica's clock is moved onto Redis's where a reply shows it off by
// more than the reply's round trip, and only then: a clock that agrees
// with Redis's stays as it is however slow a reply, and one off by a
// second is moved once, to within the round trip, and then stays put.
func TestFleetClockOntoRedis(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	f := hostileFleet(t, newMemStore(func() time.Time { return base }), func() time.Time { return base }, 0)
	ms := func(d int64) int64 { return d * int64(time.Millisecond) }
	at := func(d time.Duration) int64 { return base.Add(d).UnixMicro() } // Redis's time, µs
	sent := base.UnixNano()
	for _, c := range []struct {
		name      string
		redis     time.Duration // Redis's time when it ran the send, from base
		got       int64         // when the reply came, ns after sent
		skew, tol time.Duration // the skew wanted, within tol
	}{
		{"agrees, fast reply", 100 * time.Microsecond, ms(1), 0, 0},
		{"agrees, slow reply", 150 * time.Millisecond, ms(240), 0, 0},
		{"agrees, TIME rounded", -500 * time.Microsecond, ms(1), 0, 0},
		{"a second ahead of Redis", -time.Second + time.Millisecond, ms(2), -time.Second, 2 * time.Millisecond},
		{"then a slow reply", -time.Second + 100*time.Millisecond, ms(200), -time.Second, 2 * time.Millisecond},
		{"then agrees again (Redis failed over)", 50 * time.Millisecond, ms(100), 0, 50 * time.Millisecond},
		{"two seconds behind Redis", 2*time.Second + time.Millisecond, ms(2), 2 * time.Second, 2 * time.Millisecond},
	} {
		f.noteSkew(at(c.redis), sent, sent+c.got)
		got := time.Duration(f.skew.Load())
		if d := got - c.skew; d < -c.tol || d > c.tol {
			t.Errorf("%s: the clock moved by %v, want %v within %v", c.name, got, c.skew, c.tol)
		}
		if now := f.Now(); !now.Equal(base.Add(got)) {
			t.Errorf("%s: Now reads %v, want the base clock moved by %v", c.name, now, got)
		}
	}
}
