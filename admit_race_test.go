package epochsketch_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

// TestAdmitRacingNewKey: goroutines racing on the first requests of a new
// key, the tick standing still, never admit more than the limit together,
// and the key's count holds exactly what they admitted. Thousands of
// fresh sketches, since the race is at the key's first claim: a racer that
// read the bucket before another's claim and again after it must not
// claim a second slot (docs/DESIGN.md, Observe). Run under -race: before
// weakestOf tested the tag, 66 of 4,000 trials here admitted 3 requests
// against a burst of 2 under -race; without it the window is nanoseconds
// wide and trials rarely fail, which is why TestAdmitAfterStaleMiss lays
// the race out in order.
func TestAdmitRacingNewKey(t *testing.T) {
	trials := 4000
	if testing.Short() {
		trials = 500
	}
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("twochoice=%v", two), func(t *testing.T) {
			const goroutines, calls, wt, limit = 8, 3, 2, 4 // a burst of 2 requests, 2 counts each
			over, under := 0, 0
			for trial := range trials {
				clk := epochsketch.NewManualClock(t0)
				sk := epochsketch.New(epochsketch.Config{NumBuckets: 2, TwoChoice: two, Clock: clk, Seed: uint64(trial + 1)})
				var admitted atomic.Uint32
				var ready atomic.Int32
				parallel(goroutines, func(int) {
					// Start together: a barrier that spins, so that the racers
					// on other cores are running, not waking.
					ready.Add(1)
					for ready.Load() < goroutines {
						runtime.Gosched()
					}
					for range calls {
						if _, ok := sk.Admit(time.Time{}, "new", wt, limit); ok {
							admitted.Add(1)
						}
					}
				})
				n, est := admitted.Load(), sk.Estimate("new")
				if n*wt > limit {
					over++
					if over <= 3 {
						t.Errorf("trial %d: %d racers admitted, %d counts against a limit of %d (the key reads %d)", trial, n, n*wt, limit, est)
					}
				}
				if est != n*wt {
					t.Errorf("trial %d: the key reads %d after %d admissions of %d", trial, est, n, wt)
				}
				if n*wt < limit {
					under++ // a refusal after 4 lost compare-and-swaps
				}
				sk.Close()
			}
			if over > 0 {
				t.Fatalf("%d of %d trials admitted more than the limit", over, trials)
			}
			t.Logf("%d trials, none over the limit; %d under it (updates dropped after lost compare-and-swaps)", trials, under)
		})
	}
}

// TestAdmitAfterStaleMiss is the race of TestAdmitRacingNewKey laid out in
// order: a racer's refresh reads a miss, another claims the key's slot,
// and then the first goes on from its miss. It must find the key and
// refresh it within the limit, not claim a second slot; before weakestOf
// tested the tag, it claimed one slot per call and admitted every one.
func TestAdmitAfterStaleMiss(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 4})
	if _, ok := sk.Admit(time.Time{}, "new", 2, 4); !ok {
		t.Fatal("the first request was refused")
	}
	if est, ok := sk.AdmitAfterMiss("new", 2, 4); !ok || est != 4 {
		t.Fatalf("a racer after its stale miss: (%d, %v), want (4, true): the key's slot refreshed", est, ok)
	}
	if est, ok := sk.AdmitAfterMiss("new", 2, 4); ok || est != 4 {
		t.Fatalf("a third racer after its stale miss: (%d, %v), want (4, false): the limit reached", est, ok)
	}
	b, _ := slotOf(sk, "new")
	slots := 0
	for j := range epochsketch.SlotsPerBucket {
		if w := sk.Word(b, j); w != 0 {
			slots++
		}
	}
	if slots != 1 {
		t.Fatalf("the key holds %d slots, want 1", slots)
	}
}
