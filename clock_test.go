package epochsketch_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
)

// waitGoroutines polls until at most n goroutines run, for up to 5 s. It
// waits for goroutines to exit; it measures no speed.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines still running, want <= %d", runtime.NumGoroutine(), n)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestCloseStopsClockGoroutine(t *testing.T) {
	base := runtime.NumGoroutine()
	var sks []*epochsketch.Sketch
	for range 10 {
		sks = append(sks, epochsketch.New(epochsketch.Config{NumBuckets: 4}))
	}
	// Clock goroutines only, and at least the 10: a ticker of an earlier
	// test's unreachable Sketch may still be exiting (tickerGoroutines).
	if got := tickerGoroutines(); got < 10 {
		t.Fatalf("%d clock goroutines, want one per sketch (10)", got)
	}
	for i, sk := range sks {
		if !sk.WallTicking() {
			t.Fatalf("sketch %d: its clock goroutine is not running", i)
		}
	}
	for _, sk := range sks {
		if err := sk.Close(); err != nil {
			t.Fatal(err)
		}
		sk.Close() // idempotent
	}
	waitGoroutines(t, base)
	// Still usable after Close: the clock is read on each call instead.
	if est, first := sks[0].Observe("k"); est != 1 || !first {
		t.Fatalf("after Close: (%d, %v)", est, first)
	}
}

func TestUnreachableSketchLeaksNoGoroutine(t *testing.T) {
	base := runtime.NumGoroutine()
	for range 10 {
		sk := epochsketch.New(epochsketch.Config{NumBuckets: 4})
		sk.Observe("k")
	}
	waitGoroutines(t, base)
}

// A Sketch with an explicit clock starts no clock goroutine. The count is
// of clock goroutines only, and may fall but not rise: a ticker of an
// earlier test's unreachable Sketch can still be exiting (counting every
// goroutine made this test flaky under -race).
func TestManualAndCustomClocksStartNoGoroutine(t *testing.T) {
	base := tickerGoroutines()
	a := epochsketch.New(epochsketch.Config{Clock: epochsketch.NewManualClock(t0)})
	b := epochsketch.New(epochsketch.Config{Clock: fixedClock{t0}})
	a.Observe("x")
	b.Observe("x")
	if got := tickerGoroutines(); got > base {
		t.Fatalf("%d clock goroutines after New with explicit clocks, want at most %d", got, base)
	}
	if a.WallTicking() || b.WallTicking() {
		t.Fatal("a Sketch with an explicit clock says its clock goroutine runs")
	}
}

// tickerGoroutines counts the goroutines running a Sketch's wall clock.
func tickerGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			// The creator line is there whether or not the goroutine has
			// run yet; its first frame is not always.
			return strings.Count(string(buf[:n]), "created by github.com/epochsketch/epochsketch.startTicker")
		}
		buf = make([]byte, 2*len(buf))
	}
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// The wall-clock tick is set at New and kept current by the goroutine: with a
// 1 ms tick it must move within a short wait.
func TestWallClockTicks(t *testing.T) {
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 4, TickDuration: time.Millisecond})
	defer sk.Close()
	before := time.Now().UnixNano() / int64(time.Millisecond)
	hw := sk.HighWater()
	after := time.Now().UnixNano() / int64(time.Millisecond)
	if hw < before-1 || hw > after {
		t.Fatalf("tick at New = %d, wall clock says %d..%d", hw, before, after)
	}
	if !sk.WallTicking() {
		t.Fatal("the clock goroutine is not running")
	}
	deadline := time.Now().Add(5 * time.Second)
	for sk.HighWater() < hw+3 {
		if time.Now().After(deadline) {
			t.Fatalf("tick stuck at %d", sk.HighWater())
		}
		time.Sleep(time.Millisecond)
	}
	// Never ahead of the wall clock.
	if now := time.Now().UnixNano() / int64(time.Millisecond); sk.HighWater() > now {
		t.Fatalf("tick %d ahead of the wall clock %d", sk.HighWater(), now)
	}
}

func TestManualClock(t *testing.T) {
	c := epochsketch.NewManualClock(t0)
	c.Advance(time.Hour)
	if !c.Now().Equal(t0.Add(time.Hour)) {
		t.Fatalf("Now = %v", c.Now())
	}
	c.Advance(-2 * time.Hour)
	if !c.Now().Equal(t0.Add(-time.Hour)) {
		t.Fatalf("a negative Advance: Now = %v", c.Now())
	}
	c.Set(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("Set: Now = %v", c.Now())
	}
	var zero epochsketch.ManualClock
	if !zero.Now().Equal(time.Unix(0, 0)) {
		t.Fatalf("zero ManualClock reads %v", zero.Now())
	}
}

// A custom Clock is honoured on every call.
func TestCustomClock(t *testing.T) {
	c := &stepClock{t: t0}
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 8, Clock: c, Seed: 1})
	for range 8 {
		sk.Observe("k")
	}
	c.t = c.t.Add(2 * time.Second)
	if got := sk.Estimate("k"); got != 2 {
		t.Fatalf("Estimate = %d, want 8 >> 2", got)
	}
}

type stepClock struct{ t time.Time }

func (c *stepClock) Now() time.Time { return c.t }
