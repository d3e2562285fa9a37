package bench

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// Every peer must count what it is given: a peer that drops work would post
// a fast, meaningless number.
func TestPeersCount(t *testing.T) {
	for _, p := range Peers {
		t.Run(p.Name, func(t *testing.T) {
			c := p.New()
			var last uint32
			for range 50 {
				last = c.Observe("k")
			}
			switch p.Name {
			case "xtime-rate-map", "boom-topk", "boom-stablebloom":
				if last != 1 { // allowed (burst 100) / added / seen
					t.Fatalf("50th call returned %d, want 1", last)
				}
			case "floor-hash-bucket-cas":
				if last == 0 {
					t.Fatalf("floor returned 0")
				}
			case "tinylfu-style":
				if last != 15 { // 4-bit counters saturate at 15
					t.Fatalf("50 calls read %d, want the 4-bit maximum 15", last)
				}
			default:
				if last != 50 {
					t.Fatalf("50 calls read %d, want 50", last)
				}
			}
			if p.Fixed {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				c2 := p.New()
				runtime.GC()
				runtime.ReadMemStats(&after)
				if mib := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20); mib < 3.9 || mib > 4.5 {
					t.Errorf("fixed-memory peer holds %.2f MiB, want the common 4 MiB", mib)
				}
				runtime.KeepAlive(c2)
			}
			if p.Name == "boom-stablebloom" {
				if got := c.Observe("never-seen"); got != 0 {
					t.Fatalf("a new key reads as seen")
				}
			}
		})
	}
}

// Every limiter admits a client at twice its limit at about its limit: one
// that admitted everything, or nothing, would post a meaningless speed.
func TestLimitersLimit(t *testing.T) {
	for _, p := range LimiterPeers {
		if p.Name == "observe-threshold" {
			continue // the misuse the table shows: it counts refused requests
		}
		got := Admitted(p, 10, 2, time.Unix(1_800_000_000, 0), 10*time.Second)
		if got < 9 || got > 13 {
			t.Errorf("%s admitted %.1f/s at 2x a limit of 10/s, want 9 to 13", p.Name, got)
		}
		l := p.New(10, time.Second)
		if !l.Allow("k") {
			t.Errorf("%s refused a new key on the wall clock", p.Name)
		}
	}
}

// The peers whose library reads the clock itself are replayed at explicit
// times by a copy of their decision (AllowAt); within one window of an
// hour both forms admit the same requests of a burst, the limit's 10.
func TestLimiterReplicas(t *testing.T) {
	for _, p := range LimiterPeers {
		if p.Name == "observe-threshold" {
			continue // twice the limit at once, by design: see TestLimitersLimit
		}
		l := p.New(10, time.Hour)
		now := time.Now()
		var live, replay []bool
		for range 15 {
			live = append(live, l.Allow("live"))
			replay = append(replay, l.AllowAt(now, "replay"))
		}
		if fmt.Sprint(live) != fmt.Sprint(replay) || !live[9] || live[10] {
			t.Errorf("%s: Allow %v, AllowAt %v: want the same 10 admitted", p.Name, live, replay)
		}
		if c, ok := l.(interface{ Close() error }); ok {
			c.Close()
		}
	}
}
