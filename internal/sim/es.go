package sim

import (
	"runtime"
	"sync"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/lab"
)

// t0 anchors simulated ticks to a wall-clock instant; the tick is 1 s.
var t0 = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)

func at(tick int64) time.Time { return t0.Add(time.Duration(tick) * time.Second) }

// ES wraps the library for simulation: explicit ticks, a fixed seed.
type ES struct {
	Sk *epochsketch.Sketch
}

// Lottery is the full-bucket challenge a simulated sketch runs: the
// library's HeavyKeeper-classic, or the chip lottery that lost the selection
// test (THEORY.md section 1), which only internal/lab reaches.
type Lottery uint8

const (
	HeavyKeeper Lottery = iota
	Chip
)

// NewES returns a seeded sketch on a ManualClock at tick 0.
func NewES(buckets int, lot Lottery, two bool, seed uint64) *ES {
	sk := epochsketch.New(epochsketch.Config{
		NumBuckets: buckets, TickDuration: time.Second, Seed: seed, TwoChoice: two,
		Clock: epochsketch.NewManualClock(t0), Hash: epochsketch.HashWyhash,
	})
	if lot == Chip {
		lab.UseChip(sk)
	}
	return &ES{sk}
}

// Observe records key at tick.
func (e *ES) Observe(key string, tick int64) uint32 {
	n, _ := e.Sk.ObserveN(at(tick), key, 1)
	return n
}

// Estimate reads key at tick.
func (e *ES) Estimate(key string, tick int64) uint32 { return e.Sk.EstimateAt(at(tick), key) }

func parallelFor(n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}
