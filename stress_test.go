package epochsketch_test

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

// sweep runs f for each (GOMAXPROCS, goroutines) pair of the stress grid.
func sweep(t *testing.T, f func(t *testing.T, goroutines int)) {
	procs := []int{1, 2, 4}
	gs := []int{2, 8, 32}
	if testing.Short() {
		procs, gs = []int{2}, []int{8}
	}
	for _, p := range procs {
		for _, g := range gs {
			t.Run(fmt.Sprintf("procs=%d/goroutines=%d", p, g), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(p))
				f(t, g)
			})
		}
	}
}

func parallel(goroutines int, f func(g int)) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f(g)
		}()
	}
	close(start)
	wg.Wait()
}

// A call whose update is dropped returns the estimate it read, never the 1
// of an untracked key: a hot key under contention must not look new to a
// rate limiter.
func TestDroppedReturnsEstimate(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprint("two=", two), func(t *testing.T) {
			sweep(t, func(t *testing.T, goroutines int) {
				const warm, each = 10_000, 2000
				sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1024, TwoChoice: two})
				for range warm {
					sk.Observe("hot")
				}
				low := make([]uint32, goroutines)
				parallel(goroutines, func(g int) {
					low[g] = epochsketch.MaxCount
					for range each {
						est, _ := sk.Observe("hot")
						low[g] = min(low[g], est)
					}
				})
				for g, l := range low {
					if l < warm {
						t.Fatalf("goroutine %d got estimate %d, below the %d the key held before (dropped: %d)", g, l, warm, sk.Stats().CASRetriesExhausted)
					}
				}
			})
		})
	}
}

// For one key within one tick, every Observe either lands or is counted as
// dropped: Estimate + CASRetriesExhausted == Observes, exactly.
func TestAccountingIdentity(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprint("two=", two), func(t *testing.T) {
			sweep(t, func(t *testing.T, goroutines int) {
				const each = 2000
				sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1024, TwoChoice: two})
				parallel(goroutines, func(int) {
					for range each {
						sk.Observe("hot")
					}
				})
				est, dropped := uint64(sk.Estimate("hot")), sk.Stats().CASRetriesExhausted
				if est+dropped != uint64(goroutines*each) {
					t.Fatalf("Estimate %d + dropped %d = %d, want %d Observes", est, dropped, est+dropped, goroutines*each)
				}
			})
		})
	}
}

// Many keys, many goroutines, disjoint and shared: no key ever reads more
// than it was observed (keys are chosen without fingerprint collisions, the
// one source of overcount, measured in THEORY.md).
func TestNeverOvercount(t *testing.T) {
	sweep(t, func(t *testing.T, goroutines int) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 16})
		seen := map[[2]uint64]bool{}
		var keys []string
		for i := 0; len(keys) < 300; i++ {
			k := fmt.Sprint("key", i)
			h := sk.HashString(k)
			id := [2]uint64{uint64(sk.Buckets(h)[0]), h >> 16 & 0xffff}
			if !seen[id] {
				seen[id] = true
				keys = append(keys, k)
			}
		}
		const rounds = 40
		parallel(goroutines, func(g int) {
			for r := range rounds {
				for i, k := range keys {
					if (i+g+r)%3 == 0 {
						sk.Observe(k)
					}
				}
			}
		})
		var truth = make([]int, len(keys))
		for g := range goroutines {
			for r := range rounds {
				for i := range keys {
					if (i+g+r)%3 == 0 {
						truth[i]++
					}
				}
			}
		}
		for i, k := range keys {
			if got := int(sk.Estimate(k)); got > truth[i] {
				t.Errorf("%s reads %d, observed %d times", k, got, truth[i])
			}
		}
		assertNoDuplicates(t, sk)
	})
}

func assertNoDuplicates(t *testing.T, sk *epochsketch.Sketch) {
	t.Helper()
	for b := range sk.NumBuckets() {
		tags := map[uint16]int{}
		for j := range epochsketch.SlotsPerBucket {
			w := sk.Word(b, j)
			if w == 0 {
				continue
			}
			if c := epochsketch.CountOf(w); c == 0 || c > epochsketch.CountMax {
				t.Errorf("bucket %d slot %d: invalid count %d", b, j, c)
			}
			if prev, ok := tags[epochsketch.TagOf(w)]; ok {
				t.Errorf("bucket %d: slots %d and %d share tag %#04x", b, prev, j, epochsketch.TagOf(w))
			}
			tags[epochsketch.TagOf(w)] = j
		}
	}
}

// Goroutines race to claim slots for the same new keys while another
// goroutine moves the clock across tick boundaries, so racers disagree about
// which occupants have decayed: still never two slots with one fingerprint.
func TestNoDuplicateFingerprints(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprint("two=", two), func(t *testing.T) {
			sweep(t, func(t *testing.T, goroutines int) {
				clk := epochsketch.NewManualClock(t0)
				sk := epochsketch.New(epochsketch.Config{NumBuckets: 4, Clock: clk, Seed: 5, TwoChoice: two})
				stop := make(chan struct{})
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
							clk.Advance(time.Second)
							runtime.Gosched()
						}
					}
				}()
				parallel(goroutines, func(g int) {
					for r := range 300 {
						// Everyone chases the same small set of new keys.
						sk.Observe(fmt.Sprint("k", r%40))
						if r%7 == g%7 {
							sk.ObserveBytes([]byte(fmt.Sprint("k", (r+g)%40)))
						}
					}
				})
				close(stop)
				wg.Wait()
				assertNoDuplicates(t, sk)
			})
		})
	}
}

// One bucket, every goroutine evicting and chipping: the table stays well
// formed and stats stay consistent.
func TestEvictionStorm(t *testing.T) {
	sweep(t, func(t *testing.T, goroutines int) {
		sk, _ := newManual(t, epochsketch.Config{NumBuckets: 1})
		parallel(goroutines, func(g int) {
			for r := range 2000 {
				sk.Observe(fmt.Sprint("g", g, "r", r%50))
			}
		})
		assertNoDuplicates(t, sk)
		st := sk.Stats()
		if st.Chips > st.ChallengesLost {
			t.Errorf("Stats %+v: every chip is a lost challenge", st)
		}
	})
}
