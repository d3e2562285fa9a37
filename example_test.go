package epochsketch_test

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch"
)

// The example from the published post: three sightings of one client, then a
// new one.
func Example() {
	// Initialize a fixed table (65,536 buckets) with a 1-second tick.
	sk := epochsketch.New(epochsketch.Config{
		NumBuckets:   1 << 16,
		TickDuration: time.Second,
	})
	defer sk.Close()

	// Observe a client key multiple times.
	for i := 0; i < 3; i++ {
		est, first := sk.Observe("api_client:192.168.1.50")
		fmt.Printf("Observe #%d -> Estimate: %d, First Sight: %v\n", i+1, est, first)
	}

	// A brand new key arriving in the same window.
	est, first := sk.Observe("api_client:10.0.0.1")
	fmt.Printf("New Key     -> Estimate: %d, First Sight: %v\n", est, first)

	// Output:
	// Observe #1 -> Estimate: 1, First Sight: true
	// Observe #2 -> Estimate: 2, First Sight: false
	// Observe #3 -> Estimate: 3, First Sight: false
	// New Key     -> Estimate: 1, First Sight: true
}

// Decay is interpreted at read time: 16 sightings at one tick read 8 a tick
// later and 4 two ticks later, with nothing touching memory in between.
func ExampleSketch_Estimate() {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 1024, Clock: clk, Seed: 1})
	for range 16 {
		sk.Observe("user:42")
	}
	for range 3 {
		fmt.Println(sk.Estimate("user:42"))
		clk.Advance(time.Second)
	}
	// Output:
	// 16
	// 8
	// 4
}

// BucketsFor sizes a table by the heavy hitters it must keep, not by the
// number of distinct keys.
func ExampleBucketsFor() {
	n := epochsketch.BucketsFor(10_000)
	fmt.Println(n, "buckets,", n*64/1024, "KiB")
	// Output: 5000 buckets, 312 KiB
}
