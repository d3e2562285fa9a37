package engine

import (
	"strings"
	"testing"
)

func TestSameSeedSameRun(t *testing.T) {
	run := func() ([]string, [8]uint64) {
		s, err := New(7, 4, "heavykeeper", false)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for i := range 2000 {
			k, err := s.NextKey(Patterns[i%len(Patterns)], 1)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
			s.Observe(k)
			if i%50 == 49 {
				s.Advance(1)
			}
		}
		return keys, s.Slots(1)
	}
	k1, w1 := run()
	k2, w2 := run()
	if strings.Join(k1, ",") != strings.Join(k2, ",") || w1 != w2 {
		t.Fatal("two runs with one seed differ")
	}
}

func TestExactAndAttack(t *testing.T) {
	s, err := New(3, 16, "chip", true)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		s.Observe("k")
	}
	if got := s.Exact("k"); got != 5 {
		t.Fatalf("exact after 5 = %d", got)
	}
	s.Advance(1)
	if got := s.Exact("k"); got != 2 {
		t.Fatalf("exact after a tick = %d, want 5>>1", got)
	}
	// A whole wrap with no write to the bucket: the slot's epoch reads one
	// tick old again. This is the zombie residual of THEORY.md section 4,
	// which the simulator's wrap scenario shows.
	s.Advance(WrapTicks)
	if got, est := s.Exact("k"), s.Sketch.Estimate("k"); got != 0 || est != 5>>1 {
		t.Fatalf("after a whole quiet wrap: exact %d, estimate %d, want 0 and the zombie's %d", got, est, 5>>1)
	}
	// With a write to the bucket 24+ ticks into the idle time, the scrub
	// clears the slot before it can wrap back.
	b, _, _ := s.Locate("k")
	for range 3 {
		s.Observe("k")
	}
	s.Advance(30)
	n, err := s.NextKey("attack", b)
	if err != nil {
		t.Fatal(err)
	}
	s.Observe(n)
	s.Advance(WrapTicks - 30)
	if est := s.Sketch.Estimate("k"); est != 0 {
		t.Fatalf("after a wrap with a neighbour's write: estimate %d, want 0", est)
	}
	for range 20 {
		k, err := s.NextKey("attack", 5)
		if err != nil {
			t.Fatal(err)
		}
		if b, b2, _ := s.Locate(k); b != 5 && b2 != 5 {
			t.Fatalf("attack key %q lands in %d/%d, not 5", k, b, b2)
		}
	}
}

func TestBadInput(t *testing.T) {
	for _, c := range []struct {
		seed    uint64
		buckets int
		lottery string
		want    string
	}{
		{0, 16, "", "seed 0"},
		{1, -1, "", "NumBuckets"},
		{1, 16, "coin", "unknown lottery"},
	} {
		if _, err := New(c.seed, c.buckets, c.lottery, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%d, %d, %q) = %v, want an error about %s", c.seed, c.buckets, c.lottery, err, c.want)
		}
	}
	s, _ := New(1, 4, "", false)
	if _, err := s.NextKey("storm", 0); err == nil {
		t.Error("unknown pattern accepted")
	}
	if _, err := s.NextKey("attack", 4); err == nil {
		t.Error("attack on a bucket out of range accepted")
	}
}
