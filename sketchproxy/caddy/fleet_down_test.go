package caddyepochsketch

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/epochsketch/epochsketch"
)

// Caddys whose fleet cannot reach Redis from their start (issue 47: 2
// Caddys admitted 6.3 a second each for 10 a second): each decides alone
// at θ/N, N from min_replicas, or 2 with neither replicas nor
// min_replicas; a client under its limit is not refused. 2 Caddys, or 3
// with min_replicas 3, admit at most the limit × 1.05 plus a burst
// together; 3 with nothing set, 1.5 times the limit (the README's
// figure). On the handlers' manual clock: with Redis unreachable nothing
// else decides.
func TestFleetRedisDownFromStart(t *testing.T) {
	dead := "127.0.0.1:" + strconv.Itoa(freePort(t)) // nothing listens there
	const events, seconds, perSecond = 10, 10, 40
	bound := int(1.05*events*seconds + events)
	for _, c := range []struct {
		caddys, min int
		most        int
	}{{2, 0, bound}, {3, 3, bound}, {3, 0, int(1.5 * float64(bound))}} {
		t.Run(fmt.Sprintf("%d Caddys, min_replicas %d", c.caddys, c.min), func(t *testing.T) {
			clk := epochsketch.NewManualClock(t0)
			cfg := newConfig(t, clk)
			var caddys [][]*Handler // one handler each: a Caddy
			for i := range c.caddys {
				f := &Fleet{Redis: dead, Secret: "a-secret-of-16-bytes-at-least", MinReplicas: c.min, ID: fmt.Sprint("caddy-", i), Interval: caddy.Duration(100 * time.Millisecond)}
				caddys = append(caddys, []*Handler{cfg.provision(withFleet("per_key", zone(events, time.Second), f))})
			}
			heavy, light, lightSent := 0, 0, 0
			each := make([]int, c.caddys)
			for i := range seconds * perSecond {
				if serve(caddys[i%c.caddys], request("/", "X-Key", "heavy")).Code == 200 {
					heavy++
					each[i%c.caddys]++
				}
				if i%(perSecond/2) == 0 { // 2 a second, a fifth of its limit
					lightSent++
					if serve(caddys[i/(perSecond/2)%c.caddys], request("/", "X-Key", "light")).Code == 200 {
						light++
					}
				}
				clk.Advance(time.Second / perSecond)
			}
			t.Logf("%d Caddys at %d a second for %d s, Redis unreachable: %d admitted together (%v each, %.1f a second each), at most %d; one alone admits %d", c.caddys, events, seconds, heavy, each, float64(heavy)/float64(c.caddys*seconds), c.most, events*seconds+events)
			if heavy >= seconds*perSecond {
				t.Fatal("nothing refused: the limit never ran")
			}
			if light != lightSent {
				t.Errorf("a client at a fifth of its limit got %d of %d through", light, lightSent)
			}
			if heavy > c.most {
				t.Errorf("%d Caddys admitted %d together, more than %d", c.caddys, heavy, c.most)
			}
		})
	}
}
