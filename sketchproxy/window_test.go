package sketchproxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// TestDoorsWindowBound: through every door (the proxy, the forward-auth
// check, Envoy's service and package limit beside them), a client that
// asks every 5 ms, or in bursts at random instants, from any phase of the
// tick, is admitted in any window of length Per at most Burst × 17/16 +
// Requests × 1.05 + 1, and in any window of a tenth of Per at most Burst ×
// 17/16 + Requests × 1.05 / 10 + 1 (package rate, The window bound). When
// counts halved at each tick's end a client got 1.5 × Burst within a
// millisecond there.
func TestDoorsWindowBound(t *testing.T) {
	const requests = 7
	d := newDoorsHarness(t, requests, "1s")
	doors := []struct {
		name string
		ask  func(client string) bool
	}{
		{"proxy", func(c string) bool { return d.proxy(c).allowed }},
		{"check", func(c string) bool { return d.check(c).allowed }},
		{"envoy", func(c string) bool { return d.envoy(t, c).allowed }},
		{"package limit", func(c string) bool { return d.limit(c).allowed }},
	}
	rng := rand.New(rand.NewPCG(7, 45))
	for i, door := range doors {
		for _, pattern := range []string{"flood", "bursts", "edge"} {
			client := fmt.Sprintf("198.51.100.%d", 10*i+len(pattern))
			d.clk.Advance(time.Duration(rng.Int64N(int64(time.Second)))) // any phase
			var ts []time.Duration
			refused := 0
			if pattern == "edge" {
				// The whole burst at once a millisecond before a tick's
				// end, where halving counts gave half of it back at once.
				ns, tick := d.clk.Now().UnixNano(), int64(tickOf(t, requests, time.Second))
				d.clk.Advance(time.Duration(tick - ns%tick - int64(time.Millisecond)))
				for range requests + 1 {
					if door.ask(client) {
						ts = append(ts, 0)
					}
				}
			}
			for at := time.Duration(0); at < 12*time.Second; {
				if door.ask(client) {
					ts = append(ts, at)
				} else {
					refused++
				}
				step := 5 * time.Millisecond
				if pattern == "bursts" {
					step = time.Microsecond
					if rng.IntN(10) == 0 {
						step = time.Duration(rng.Int64N(int64(time.Second)))
					}
				}
				at += step
				d.clk.Advance(step)
			}
			if len(ts) == 0 || refused == 0 {
				t.Fatalf("%s, %s: %d admitted and %d refused in 12 s: the limit did not run", door.name, pattern, len(ts), refused)
			}
			slices.Sort(ts)
			for _, div := range []int{1, 10} {
				w := time.Second / time.Duration(div)
				got := testkit.MaxInWindow(ts, w)
				bound := float64(requests)*17/16 + float64(requests)*1.05/float64(div) + 1
				if float64(got) > bound {
					t.Errorf("%s, %s: %d admitted within %v, want at most %.2f", door.name, pattern, got, w, bound)
				}
			}
		}
	}
}

// TestRetryAfterSpread: 1,000 clients refused at random instants over a
// tick are told to come back at instants spread over at least half of
// it, at most a tenth of them in any second: quota comes back step by
// step, for each key from its own history, not at a tick's end every key
// shares. When counts halved at each tick's end, every one of them was
// sent back to the same second.
func TestRetryAfterSpread(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: api\n    limits: [{requests: 10, per: 1m}]\n")
	tick := tickOf(t, 10, time.Minute)
	rng := rand.New(rand.NewPCG(1, 2))
	offsets := make([]time.Duration, 1000)
	for i := range offsets {
		offsets[i] = time.Duration(rng.Int64N(int64(tick)))
	}
	slices.Sort(offsets)
	start := h.clk.Now()
	var back []time.Duration // when each client is told to come back, from start
	for i, off := range offsets {
		h.clk.Set(start.Add(off))
		client := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		var w = h.req(client)
		for range 11 { // its burst of 10, and one more
			w = h.req(client)
		}
		if w.Code != 429 {
			t.Fatalf("client %d: %d after 12 requests, want 429", i, w.Code)
		}
		ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if err != nil || ra < 1 {
			t.Fatalf("client %d: Retry-After %q", i, w.Header().Get("Retry-After"))
		}
		back = append(back, off+time.Duration(ra)*time.Second)
	}
	slices.Sort(back)
	spread := back[len(back)-1] - back[0]
	t.Logf("1,000 refused clients told to come back over %v (the tick: %v)", spread, tick)
	if spread < tick/2 {
		t.Fatalf("1,000 refused clients told to come back within %v, want at least half the tick (%v)", spread, tick/2)
	}
	// Quota comes back at the starts of a tick's 32 steps, which every key
	// shares, and Retry-After rounds up to whole seconds (a step is 1.26
	// s here): about two steps' share at most in any second, where it
	// was all of them.
	if n := testkit.MaxInWindow(back, time.Second); n > 100 {
		t.Fatalf("%d of 1,000 told to come back within one second, want at most 100", n)
	}
}
