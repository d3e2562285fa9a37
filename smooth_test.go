package epochsketch_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/admit"
)

// smoothTick is the tick of the smooth-decay tests: 3.2 s, so that its
// steps start at whole-ish instants.
const smoothTick = 3200 * time.Millisecond

func newSmooth(t *testing.T) (*epochsketch.Sketch, *epochsketch.ManualClock) {
	t.Helper()
	clk := epochsketch.NewManualClock(time.Unix(0, 0).Add(1000 * smoothTick)) // a tick's start
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: smoothTick, Clock: clk, Seed: 3})
	admit.SetSmooth(sk)
	t.Cleanup(func() { sk.Close() })
	return sk, clk
}

// TestSmoothDecay: a smooth sketch's count reads lower step by step over
// a tick, never higher, and reads half (rounded up) a whole tick on, as a
// classic sketch's does at the tick's end; every step of the tick lowers
// it by at most one part in 32 (plus the rounding up).
func TestSmoothDecay(t *testing.T) {
	sk, clk := newSmooth(t)
	if est, _ := sk.ObserveN(time.Time{}, "k", 1000); est != 1000 {
		t.Fatalf("added 1000: reads %d", est)
	}
	b := admit.BoundsFor(smoothTick)
	prev := uint32(1000)
	start := clk.Now()
	for j := 1; j < admit.Steps; j++ {
		clk.Set(start.Add(time.Duration(b[j]) - 1))
		if got := sk.Estimate("k"); got != prev {
			t.Fatalf("1 ns before step %d: %d, want %d (nothing changes within a step)", j, got, prev)
		}
		clk.Set(start.Add(time.Duration(b[j])))
		got := sk.Estimate("k")
		want := (1000*admit.Scale(0) + admit.Scale(j) - 1) / admit.Scale(j)
		if got != want || got > prev || prev-got > prev/32+1 {
			t.Fatalf("step %d: %d, want %d (from %d)", j, got, want, prev)
		}
		prev = got
	}
	clk.Set(start.Add(smoothTick))
	if got := sk.Estimate("k"); got != 500 {
		t.Fatalf("a tick on: %d, want 500", got)
	}
}

// TestSmoothAdmitExact: a conditional add fits exactly when the count it
// reads plus its weight stays within the limit, at every step; and
// admit.Fit names the first instant a refused add fits, to the
// nanosecond.
func TestSmoothAdmitExact(t *testing.T) {
	sk, clk := newSmooth(t)
	add, _ := admit.Bind(sk)
	b := admit.BoundsFor(smoothTick)
	const limit = 21
	for i := range 10 {
		if r, ok := add(time.Time{}, "k", 2, limit); !ok || r.Est != uint32(2*(i+1)) {
			t.Fatalf("add %d: %+v %v", i+1, r, ok)
		}
	}
	clk.Advance(time.Duration(b[5]) + 17)
	r, ok := add(time.Time{}, "k", 4, limit)
	if ok || r.Est+4 <= limit {
		t.Fatalf("4 more at 20: %+v %v, want a refusal reading above 17", r, ok)
	}
	tick, step, fits := admit.Fit(r.Raw, limit-4, r.Tick, int(r.Step))
	if !fits {
		t.Fatal("never fits")
	}
	at := time.Unix(0, tick*int64(smoothTick)+b[step])
	if r2, ok := add(at.Add(-1), "k", 4, limit); ok {
		t.Fatalf("admitted 1 ns before the instant Fit names (%v): %+v", at, r2)
	}
	if r2, ok := add(at, "k", 4, limit); !ok || r2.Est > limit {
		t.Fatalf("refused at the instant Fit names (%v): %+v", at, r2)
	}
}

// TestSmoothSnapshot: a smooth sketch's snapshot reads back only into a
// smooth sketch: a classic one would read its scaled counts wrongly.
func TestSmoothSnapshot(t *testing.T) {
	sk, clk := newSmooth(t)
	sk.ObserveN(time.Time{}, "k", 10)
	var buf bytes.Buffer
	if _, err := sk.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	cfg := epochsketch.Config{NumBuckets: 64, TickDuration: smoothTick, Clock: clk, Seed: 3}
	classic := epochsketch.New(cfg)
	defer classic.Close()
	var se *epochsketch.SnapshotError
	if _, err := classic.ReadFrom(bytes.NewReader(data)); !errors.As(err, &se) {
		t.Fatalf("a smooth snapshot into a classic sketch: %v, want a SnapshotError", err)
	}
	smooth := epochsketch.New(cfg)
	defer smooth.Close()
	admit.SetSmooth(smooth)
	if _, err := smooth.ReadFrom(bytes.NewReader(data)); err != nil || smooth.Estimate("k") != 10 {
		t.Fatalf("into a smooth one: %v, reads %d, want 10", err, smooth.Estimate("k"))
	}
}

// TestSmoothWallClock: on the wall clock, the goroutine publishes the
// steps, so that a count reads lower before the tick ends.
func TestSmoothWallClock(t *testing.T) {
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 64, TickDuration: 400 * time.Millisecond})
	defer sk.Close()
	admit.SetSmooth(sk)
	sk.ObserveN(time.Time{}, "k", 6400)
	halvings := map[uint32]bool{}
	for c := uint32(6400); ; c = (c + 1) / 2 {
		halvings[c] = true
		if c <= 1 {
			break
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if est := sk.Estimate("k"); !halvings[est] {
			return // between two halvings: a step within a tick
		}
		time.Sleep(3 * time.Millisecond)
	}
	t.Fatalf("no step within a tick seen in 5 s: reads %d", sk.Estimate("k"))
}

// TestScaleDownExact: the reciprocal that rounds a smooth sketch's counts
// up agrees with a division for every count a slot holds, at every step
// (every count below 2^24 at three steps without -short, and a spread of
// counts at all).
func TestScaleDownExact(t *testing.T) {
	check := func(c, sc uint32) {
		if got, want := epochsketch.ScaleDown(c, sc), (c+sc-1)/sc; got != want {
			t.Fatalf("scaleDown(%d, %d) = %d, want %d", c, sc, got, want)
		}
	}
	every := []int{0, 1, 31}
	if testing.Short() {
		every = nil // the strided pass below, in seconds under qemu and -race
	}
	for _, j := range every {
		for c := uint32(0); c < 1<<24; c++ {
			check(c, admit.Scale(j))
		}
	}
	for j := range admit.Steps {
		for c := uint32(0); c < 1<<24; c += 997 {
			check(c, admit.Scale(j))
		}
		check(1<<24-1, admit.Scale(j))
	}
}
