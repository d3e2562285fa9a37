package caddyepochsketch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
)

// 3 Caddys sharing a fleet through a real redis-server, 100 calls in 100
// ms round robin at 20 a minute, each of 3 fresh keys. Each Caddy spent
// its quiet share of a key just shared unseen while the others took it
// again: 22 at 8e1eb9e (the issue measured 20, 21 and 23), 21 to 24
// before claims (docs/fleets.md, A key just shared). The test holds them
// to the burst and a client under its limit to all of its requests.
// On the wall clock, by which Redis's TIME dates the records, inside one
// tick (30 s).
func TestFleetBurstThroughRedis(t *testing.T) {
	addr, _ := startRedisServer(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	var caddys [][]*Handler
	for i := range 3 {
		h := withFleet("per_key", zone(20, time.Minute), &Fleet{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: fmt.Sprint("caddy-", i), Interval: caddy.Duration(100 * time.Millisecond)})
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		h.logger = zap.NewNop()
		t.Cleanup(func() { h.Cleanup() })
		caddys = append(caddys, []*Handler{h})
	}
	time.Sleep(time.Second) // 10 rounds: each counts the 3 heartbeats
	const tick = 30 * time.Second
	for k := range 3 {
		if left := tick - time.Duration(time.Now().UnixNano()%int64(tick)); left < time.Second {
			time.Sleep(left + 20*time.Millisecond)
		}
		admitted, light := 0, 0
		for i := range 100 {
			if serve(caddys[i%3], request("/", "X-Key", fmt.Sprint("heavy-", k))).Code == 200 {
				admitted++
			}
			if i%20 == 0 && serve(caddys[i/20%3], request("/", "X-Key", fmt.Sprint("light-", k))).Code == 200 {
				light++
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("key %d: 3 Caddys admitted %d of 100 calls in 100 ms at 20 a minute; a client under its limit %d of 5", k, admitted, light)
		if admitted >= 100 {
			t.Fatal("nothing refused: the limit never ran")
		}
		if light != 5 {
			t.Errorf("a client under its limit got %d of 5 through", light)
		}
		if admitted > 20 {
			t.Errorf("3 Caddys admitted %d of a burst of 20 in 100 ms, want at most 20", admitted)
		}
	}
}
