package fleet

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// The most replicas seen outlives the replicas that left for an hour:
// the last of a fleet stopped one replica after another keeps the whole
// fleet's count, not its own.
func TestFleetMembersPeakKept(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	f := newFleetOn(&config.FleetConfig{Interval: config.Duration(500 * time.Millisecond)}, []byte("0123456789abcdef"), newMemStore(clk.Now), slog.New(slog.NewTextHandler(io.Discard, nil)), clk.Now)
	f.up.Store(true)
	f.noteMembers(3, 0)
	seen := clk.Now()
	for range 50 {
		clk.Advance(time.Minute)
		f.noteMembers(1, 0)
	}
	if n, at := f.Members(); n != 3 || !at.Equal(seen) {
		t.Errorf("50 minutes after 3 were seen, 1 since: %d at %v, want 3 at %v", n, at, seen)
	}
	if n := f.replicas(); n != 1 {
		t.Errorf("N, Redis up and counting 1 for 50 minutes: %d, want 1", n)
	}
	clk.Advance(11 * time.Minute)
	f.noteMembers(1, 0)
	if n, _ := f.Members(); n != 1 {
		t.Errorf("an hour after 3 were last seen: %d, want 1", n)
	}
}

// A failover to a node whose clock is behind the old one's: a replica's
// reckoning of Redis's time followed only later replies, so it stayed
// ahead, and its heartbeat, dated by it, read as from the future and was
// dropped by the script (a review's reading). Its reckoning follows
// Redis's clock back past a second.
func TestFleetRedisClockBack(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	f := hostileFleet(t, newMemStore(clk.Now), clk.Now, 0)
	ahead := clk.Now().Add(10 * time.Second).UnixMicro()
	f.noteRedisTime(ahead)
	f.noteRedisTime(clk.Now().Add(-time.Millisecond).UnixMicro() + 10*time.Second.Microseconds()) // a reply a moment late: kept
	if got := f.redisClock(); got != ahead {
		t.Fatalf("a reply a moment older moved the reckoning to %d, want %d", got, ahead)
	}
	f.noteRedisTime(clk.Now().UnixMicro()) // the new node, 10 s behind
	if got, want := f.redisClock(), clk.Now().UnixMicro(); got != want {
		t.Errorf("after a failover to a clock 10 s behind, the reckoning is %d, want %d", got, want)
	}
}
