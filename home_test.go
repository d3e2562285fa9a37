package epochsketch

import (
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/internal/keystream"
)

// Nearly every tracked key lives in its home slot (docs/DESIGN.md, Buckets),
// which is what lets refresh read its word without waiting for the search.
// On the benchmark's Zipf stream, after the table is warm, at least 95% of
// the calls that find their key find it at home (97.9% when written).
func TestKeysLiveAtHome(t *testing.T) {
	w := keystream.Zipf(1)
	sk := New(Config{NumBuckets: 1 << 16, Seed: 1, Clock: NewManualClock(time.Unix(1_700_000_000, 0))})
	defer sk.Close()
	const warm, n = 1 << 20, 1 << 20
	for i := range warm {
		sk.Observe(w.String(i))
	}
	hits, home, emptyHome := 0, 0, 0
	for i := warm; i < warm+n; i++ {
		h := sk.h.str(w.String(i))
		b := &sk.table[sk.first(h)]
		if m := matchMask(b, uint64(tagFrom(h))); m != 0 {
			hits++
			if m&(1<<homeOf(h)) != 0 {
				home++
			}
		} else if b.s[homeOf(h)].Load() == 0 {
			emptyHome++
		}
		sk.Observe(w.String(i))
	}
	share := float64(home) / float64(hits)
	t.Logf("%d of %d calls found their key (%.1f%%), %.2f%% of those at home; %.1f%% of the misses found their home slot empty",
		hits, n, 100*float64(hits)/n, 100*share, 100*float64(emptyHome)/float64(n-hits))
	if share < 0.95 {
		t.Fatalf("%.2f%% of hits at home, want at least 95%%", 100*share)
	}
}

// For a power-of-two table, first's shift picks exactly the bucket that
// multiply-shift picks, so tables of every size keep one placement
// (snapshots included).
func TestFirstShiftIsMultiplyShift(t *testing.T) {
	x := uint64(1)
	for k := 0; k <= 16; k++ {
		nb := 1 << k
		sk := New(Config{NumBuckets: nb, Seed: 1, Clock: NewManualClock(time.Unix(1_700_000_000, 0))})
		if !sk.pow2 {
			t.Fatalf("NumBuckets %d: not taken as a power of two", nb)
		}
		for range 10_000 {
			x = splitmix64(x)
			if got, want := sk.first(x), (x>>32)*uint64(nb)>>32; got != want {
				t.Fatalf("NumBuckets %d, h %#x: bucket %d, multiply-shift %d", nb, x, got, want)
			}
		}
		sk.Close()
	}
	for _, nb := range []int{3, 1000, 65535} {
		if sk := New(Config{NumBuckets: nb, Seed: 1}); sk.pow2 {
			t.Fatalf("NumBuckets %d taken as a power of two", nb)
		} else {
			sk.Close()
		}
	}
	// The largest table's shift, 2^32 buckets, checked without allocating it.
	for range 10_000 {
		x = splitmix64(x)
		if got, want := x>>(64-32), (x>>32)*(1<<32)>>32; got != want {
			t.Fatalf("2^32 buckets, h %#x: %d, want %d", x, got, want)
		}
	}
}
