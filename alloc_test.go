package epochsketch_test

import (
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

// Zero allocations per call is a contract (C2), so it is a test.
func TestZeroAllocs(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("instrumented builds allocate")
	}
	wall := epochsketch.New(epochsketch.Config{NumBuckets: 1024})
	defer wall.Close()
	manual := epochsketch.New(epochsketch.Config{NumBuckets: 1024, Clock: epochsketch.NewManualClock(t0), Seed: 1})
	sip := epochsketch.New(epochsketch.Config{NumBuckets: 1, Hash: epochsketch.HashSipHash13})
	defer sip.Close()
	two := epochsketch.New(epochsketch.Config{NumBuckets: 1024, TwoChoice: true})
	defer two.Close()
	key, kb := "api_client:192.168.1.50", []byte("api_client:10.0.0.1")
	i := 0
	for name, f := range map[string]func(){
		"Observe":              func() { wall.Observe(key) },
		"ObserveBytes":         func() { wall.ObserveBytes(kb) },
		"ObserveN":             func() { wall.ObserveN(time.Time{}, key, 100) },
		"ObserveBytesN":        func() { wall.ObserveBytesN(time.Time{}, kb, 3) },
		"Estimate":             func() { wall.Estimate(key) },
		"EstimateBytes":        func() { wall.EstimateBytes(kb) },
		"EstimateBytesAt":      func() { manual.EstimateBytesAt(t0, kb) },
		"Observe/manual":       func() { manual.Observe(key) },
		"Observe/siphash/full": func() { i++; sip.ObserveBytes(append(kb[:0:0], byte(i))) },
		"ObserveN at t":        func() { manual.ObserveN(t0, key, 1) },
		"Observe/two":          func() { two.Observe(key) },
	} {
		if name == "Observe/siphash/full" {
			// The append above allocates the key itself; measure the call.
			keys := make([][]byte, 300)
			for j := range keys {
				keys[j] = []byte{byte(j), byte(j >> 8)}
			}
			f = func() { i++; sip.ObserveBytes(keys[i%len(keys)]) }
		}
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocs per call, want 0", name, n)
		}
	}
}
