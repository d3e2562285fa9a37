package caddyepochsketch

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/epochsketch/epochsketch"
)

// startRedisServer runs Debian's redis-server on a free loopback port for
// the test, as sketchproxy's fleet tests do (skipped without it, but in
// CI). It returns the address and a function that kills the server.
func startRedisServer(t *testing.T) (addr string, kill func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no redis-server in CI")
		}
		t.Skip("no redis-server (Debian: redis-server)")
	}
	port := freePort(t)
	addr = "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	kill = func() {
		cmd.Process.Kill()
		<-exited
	}
	t.Cleanup(kill)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not answer on %s", addr)
		}
	}
	return addr, kill
}

// testFleet is a fleet of n replicas on addr, as replica id.
func testFleet(addr, id string, n int) *Fleet {
	return &Fleet{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", Replicas: n, ID: id, Interval: caddy.Duration(100 * time.Millisecond)}
}

// withFleet is a handler of one zone with fleet f.
func withFleet(name string, z *Zone, f *Fleet) *Handler {
	h := one(name, z)
	h.Fleet = f
	return h
}

// Handlers whose fleet settings are equal decide in one engine with one
// fleet; other settings get another; handlers without a fleet keep the
// process's engine. A reload that keeps the settings keeps the fleet and
// the zones' counts; the last config that uses a fleet stops it.
func TestFleetPool(t *testing.T) {
	addr, _ := startRedisServer(t)
	clk := epochsketch.NewManualClock(t0)
	c := newConfig(t, clk)
	a := c.provision(withFleet("per_key", zone(2, time.Hour), testFleet(addr, "a", 1)))
	b := c.provision(withFleet("other", zone(2, time.Hour), testFleet(addr, "a", 1)))
	d := c.provision(withFleet("per_key", zone(2, time.Hour), testFleet(addr, "d", 1)))
	alone := c.provision(one("per_key", zone(2, time.Hour)))
	if a.fleet == nil || a.fleet != b.fleet || a.eng != b.eng {
		t.Fatal("two handlers with equal fleet settings got two fleets")
	}
	if d.fleet == a.fleet || d.eng == a.eng {
		t.Fatal("other fleet settings share the first fleet")
	}
	if alone.fleet != nil || alone.eng == a.eng || alone.eng != engineFor(clk, 1) {
		t.Fatal("a handler without a fleet left the process's engine")
	}
	if got := codes([]*Handler{a}, 3, "/", "X-Key", "k"); got != "200 200 429" {
		t.Fatalf("2 an hour through the fleet: %s", got)
	}
	w := serve([]*Handler{a}, request("/", "X-Key", "k"))
	if !strings.Contains(w.Header().Get("RateLimit"), `"per_key-per-1h";r=0;`) || !strings.Contains(w.Body.String(), `"rule":"per_key"`) {
		t.Errorf("a refusal names the zone in the fleet's engine as elsewhere: RateLimit %q, body %s", w.Header().Get("RateLimit"), w.Body)
	}
	// The reload: the same settings, provisioned before the old config is
	// cleaned up.
	r := newConfig(t, clk)
	a2 := r.provision(withFleet("per_key", zone(2, time.Hour), testFleet(addr, "a", 1)))
	if a2.fleet != a.fleet || a2.zones[0].state != a.zones[0].state {
		t.Fatal("a reload with the same fleet settings started a new fleet or new counts")
	}
	key := a.fleet.key
	for _, h := range []*Handler{a, b, d, alone} {
		h.Cleanup()
	}
	if got := codes([]*Handler{a2}, 1, "/", "X-Key", "k"); got != "429" {
		t.Errorf("after the old config's cleanup: %s, want 429 (the counts kept)", got)
	}
	if n, ok := fleets.References(key); !ok || n != 1 {
		t.Errorf("references to the kept fleet: %d, %v; want 1", n, ok)
	}
	a2.Cleanup()
	if _, ok := fleets.References(key); ok {
		t.Error("the fleet stays in the pool after the last config that used it")
	}
	// The metrics count from Caddy's start: a stopped fleet's decisions
	// stay, under the zone's name.
	var rejects uint64
	decisions(func(l decisionLabel, n uint64) {
		if l == (decisionLabel{"per_key", "reject"}) {
			rejects += n
		}
	})
	if rejects < 3 {
		t.Errorf("per_key's refusals in the metrics after its fleet stopped: %d, want at least the 3 refused here", rejects)
	}
}

// In a fleet's engine, each zone's rule is named by its zone and a hash of
// its place and definition: two places with the same zone name never
// share a count in Redis (unless shared), and the name is the same
// wherever the same configuration runs, whatever the replica's own
// settings (its id), so replicas meet.
func TestFleetRuleNames(t *testing.T) {
	addr, _ := startRedisServer(t)
	clk := epochsketch.NewManualClock(t0)
	rules := func(id string) []string {
		c := newConfig(t, clk)
		sh := zone(2, time.Hour)
		sh.Shared = true
		hs := []*Handler{
			c.provision(withFleet("per_key", zone(2, time.Hour), testFleet(addr, id, 1))),
			c.provision(withFleet("per_key", zone(2, time.Hour), testFleet(addr, id, 1))), // a second place
			c.provision(withFleet("per_key", zone(3, time.Hour), testFleet(addr, id, 1))), // another definition
			c.provision(withFleet("per_key", sh, testFleet(addr, id, 1))),
			c.provision(withFleet("per_key", sh, testFleet(addr, id, 1))),
		}
		var names []string
		for _, h := range hs {
			names = append(names, h.zones[0].state.rule.Name)
			h.Cleanup()
		}
		return names
	}
	a := rules("a")
	for i, n := range a {
		if zoneOf(n) != "per_key" || !strings.HasPrefix(n, "per_key@") {
			t.Errorf("rule %d: %q, want per_key@ and a hash", i, n)
		}
	}
	if a[0] == a[1] || a[0] == a[2] || a[1] == a[2] || a[0] == a[3] {
		t.Errorf("two places or definitions share a rule name: %q", a)
	}
	if a[3] != a[4] {
		t.Errorf("shared zones have two rule names: %q", a[3:])
	}
	if b := rules("b"); strings.Join(b, " ") != strings.Join(a, " ") {
		t.Errorf("another replica (id b) names the rules %q, replica a %q: they would not meet in Redis", b, a)
	}
}

// Redis unreachable: the zones still decide, locally at θ/N (a fleet is
// local until its first round succeeds), and no request fails.
func TestFleetRedisDown(t *testing.T) {
	f := testFleet("127.0.0.1:"+strconv.Itoa(freePort(t)), "a", 2) // nothing listens there
	c := newConfig(t, epochsketch.NewManualClock(t0))
	h := c.provision(withFleet("per_key", zone(4, time.Hour), f))
	time.Sleep(200 * time.Millisecond) // a round or two have failed
	if got := codes([]*Handler{h}, 3, "/", "X-Key", "k"); got != "200 200 429" {
		t.Errorf("4 an hour over 2 replicas, Redis down: %s, want 200 200 429 (θ/N)", got)
	}
}
