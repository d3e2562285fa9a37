package sketchproxy

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Each fleet started gets a name of its own: two Limiters in one process
// with one fleet section (or a Caddy zone's fleet and another) each write
// their own record, and count as two replicas.
func TestFleetSelfIsPerFleet(t *testing.T) {
	cfg := &Config{Fleet: &FleetConfig{Redis: "127.0.0.1:1", Secret: "0123456789abcdef"}}
	var fb fleetBuilt
	if err := cfg.validateFleet(&fb); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := newFleet(cfg.Fleet, &fb, log, time.Now)
	defer a.close()
	b := newFleet(cfg.Fleet, &fb, log, time.Now)
	defer b.close()
	if a.self == b.self || !strings.HasPrefix(a.self, cfg.Fleet.ID+".") || !strings.HasPrefix(b.self, cfg.Fleet.ID+".") {
		t.Errorf("two fleets of id %q in one process are named %q and %q, want two names of their own", cfg.Fleet.ID, a.self, b.self)
	}
}

// Two Limiters in one process with one fleet section (the same id, and
// replicas counted by the heartbeat) enforce one limit between them, as
// two processes do: before each fleet had a name of its own, they wrote
// one record and counted one replica, and admitted the limit twice over.
// Through a real redis-server, on the wall clock: a client at 4x for 2 s.
func TestLimiterFleetsInOneProcess(t *testing.T) {
	addr := startRedisServer(t)
	fc := &FleetConfig{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: "same", Interval: Duration(100 * time.Millisecond)}
	newLimiter := func(fleet *FleetConfig) *Limiter {
		l, err := NewLimiter(LimiterConfig{Requests: 20, Per: time.Second, Fleet: fleet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	ls := [2]*Limiter{newLimiter(fc), newLimiter(fc)}
	alone := newLimiter(nil)
	time.Sleep(300 * time.Millisecond) // both heartbeats in
	fleet, one, sent := 0, 0, 0
	for start := time.Now(); time.Since(start) < 2*time.Second; sent++ {
		if ls[sent%2].Allow("client") {
			fleet++
		}
		if alone.Allow("client") {
			one++
		}
		time.Sleep(12500 * time.Microsecond)
	}
	t.Logf("%d requests: two Limiters of one fleet section admitted %d, one alone %d", sent, fleet, one)
	if float64(fleet) > 1.25*float64(one)+20 {
		t.Errorf("two Limiters of one fleet section in one process admitted %d, one alone %d: they counted as one replica", fleet, one)
	}
}
