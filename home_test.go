package epochsketch

import (
	"math/bits"
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
	warm, n := 1<<20, 1<<20
	if testing.Short() {
		warm, n = 1<<18, 1<<18 // the share holds at this scale; make test-long runs 2^20
	}
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
		hits, n, 100*float64(hits)/float64(n), 100*share, 100*float64(emptyHome)/float64(n-hits))
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

// refresh tells its cases apart with one SWAR test over the packed tags
// (another slot holds the tag?) and the home word's tag and epoch. On
// random buckets of a few tags chosen to provoke borrows between lanes
// (0x7fff, 0x8000, 0xffff, neighbours), written this tick or a few ticks
// ago, with counts and weights that sometimes pass MaxCount, and limits
// (admit's) that sometimes refuse, each call must do what a plain loop over
// the slots says: refresh the key's only slot (decayed, plus the weight,
// saturated), refuse without writing when that passes the limit, report a
// miss, or leave a duplicate.
func TestRefreshCases(t *testing.T) {
	tags := []uint16{1, 2, 0x00ff, 0x0100, 0x1234, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff}
	ages := []uint32{0, 0, 0, 1, 2, 5}
	const now = int64(1000)
	e := epoch24(now)
	x := uint64(1)
	seen := map[string]int{}
	for range 200_000 {
		var b bucket
		for k := range slotsPerBucket {
			x = splitmix64(x)
			if x%3 != 0 {
				c := uint32(x>>32)%100 + 1
				if x>>20%8 == 0 {
					c = countMax - uint32(x>>40)%4
				}
				b.s[k].Store(pack(tags[x>>8%uint64(len(tags))], e-ages[x>>16%uint64(len(ages))], c))
			}
		}
		x = splitmix64(x)
		tag := tags[x%uint64(len(tags))]
		home := int(x>>8) & 7
		h := uint64(tag)<<16 | uint64(home)<<homeShift
		wt := uint32(1)
		if x>>24%4 == 0 {
			wt = uint32(x>>32)%countMax + 1
		}
		// Observe's top, countMax, half the time; else admit's limit, at
		// least wt: near the small counts, or just below MaxCount.
		limit := uint32(countMax)
		switch x >> 56 % 4 {
		case 0:
			limit = max(wt, uint32(x>>40)%120)
		case 1:
			limit = max(wt, countMax-1-uint32(x>>40)%8)
		}
		var words [slotsPerBucket]uint64
		var m uint8
		for k := range words {
			words[k] = b.s[k].Load()
			if words[k] != 0 && tagOf(words[k]) == tag {
				m |= 1 << k
			}
		}
		est, first, lost, miss := refresh(&b, h, now, wt, limit)
		want := words
		switch {
		case m == 0:
			seen["miss"]++
			if est != 0 || !miss || lost != 0 {
				t.Fatalf("tag %04x, home %d, bucket %x: (%d, %v, %d, %v), want a miss", tag, home, words, est, first, lost, miss)
			}
		case m&(m-1) != 0:
			seen["duplicate"]++
			if est != 0 || miss || lost != 0 {
				t.Fatalf("tag %04x, home %d, bucket %x: (%d, %v, %d, %v), want a duplicate left to observe1", tag, home, words, est, first, lost, miss)
			}
		default:
			k := bits.TrailingZeros8(m)
			if k == home {
				seen["home"]++
			} else {
				seen["away"]++
			}
			age := e - epochOf(words[k])
			if d := countOf(words[k]) >> age; limit < countMax && d+wt > limit {
				seen["refused"]++
				if est != d|overLimit || lost != 0 || miss {
					t.Fatalf("tag %04x, home %d, weight %d, limit %d, bucket %x: (%d, %v, %d, %v), want slot %d's %d refused", tag, home, wt, limit, words, est, first, lost, miss, k, d)
				}
				break // nothing written
			}
			c := min(countOf(words[k])>>age+wt, countMax)
			if c == countMax {
				seen["saturated"]++
			}
			if age != 0 {
				seen["first this tick"]++
			}
			want[k] = pack(tag, e, c)
			if est != c || first != (age != 0) || lost != 0 || miss {
				t.Fatalf("tag %04x, home %d, weight %d, bucket %x: (%d, %v, %d, %v), want slot %d refreshed to %d", tag, home, wt, words, est, first, lost, miss, k, c)
			}
		}
		for k := range want {
			if got := b.s[k].Load(); got != want[k] {
				t.Fatalf("tag %04x, home %d: slot %d holds %x, want %x", tag, home, k, got, want[k])
			}
		}
	}
	for _, c := range []string{"miss", "duplicate", "home", "away", "saturated", "first this tick", "refused"} {
		if seen[c] < 1000 {
			t.Errorf("only %d trials of case %s", seen[c], c)
		}
	}
}
