package epochsketch_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"

	"github.com/epochsketch/epochsketch"
)

// Fed by a sketch on a Zipf stream, the TopK names the true heaviest keys.
func TestTopKFindsHeavyHitters(t *testing.T) {
	sk, _ := newManual(t, epochsketch.Config{NumBuckets: 4096})
	top := epochsketch.NewTopK(20)
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.2, 1, 99_999)
	exact := map[string]int{}
	for range 300_000 {
		k := fmt.Sprint("k", z.Uint64())
		exact[k]++
		est, _ := sk.Observe(k)
		top.Offer(k, est)
	}
	type kc struct {
		k string
		c int
	}
	var all []kc
	for k, c := range exact {
		all = append(all, kc{k, c})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c > all[j].c })
	got := map[string]bool{}
	for _, e := range top.List() {
		got[e.Key] = true
	}
	hits := 0
	for _, x := range all[:20] {
		if got[x.k] {
			hits++
		}
	}
	if hits < 19 {
		t.Fatalf("TopK holds %d of the true top 20", hits)
	}
	l := top.List()
	if len(l) != 20 || top.Len() != 20 {
		t.Fatalf("List has %d entries, Len %d, want 20", len(l), top.Len())
	}
	for i := 1; i < len(l); i++ {
		if l[i].Estimate > l[i-1].Estimate {
			t.Fatalf("List not sorted: %v", l)
		}
	}
}

func TestTopKSemantics(t *testing.T) {
	top := epochsketch.NewTopK(3)
	for i, k := range []string{"a", "b", "c"} {
		top.Offer(k, uint32(10*(i+1))) // a=10 b=20 c=30
	}
	top.Offer("d", 5) // below the minimum: ignored
	top.OfferBytes([]byte("e"), 15)
	top.Offer("b", 40) // an update moves b up
	want := []epochsketch.TopEntry{{"b", 40}, {"c", 30}, {"e", 15}}
	if got := top.List(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("List = %v, want %v", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NewTopK(0) did not panic")
		}
	}()
	epochsketch.NewTopK(0)
}

// OfferBytes copies a key it keeps: reusing the caller's buffer is safe.
func TestTopKOfferBytesCopies(t *testing.T) {
	top := epochsketch.NewTopK(2)
	buf := []byte("alpha")
	top.OfferBytes(buf, 5)
	copy(buf, "omega")
	if l := top.List(); l[0].Key != "alpha" {
		t.Fatalf("stored key changed with the caller's buffer: %q", l[0].Key)
	}
}

// Below the minimum of a full TopK an offer costs no allocation.
func TestTopKOfferBelowFloorAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("instrumented builds allocate")
	}
	top := epochsketch.NewTopK(2)
	top.Offer("a", 100)
	top.Offer("b", 100)
	kb := []byte("mouse")
	if n := testing.AllocsPerRun(1000, func() { top.Offer("mouse", 3); top.OfferBytes(kb, 3) }); n != 0 {
		t.Fatalf("%v allocs per offer below the floor", n)
	}
	if n := testing.AllocsPerRun(1000, func() { top.OfferBytes([]byte("a"), 101) }); n != 0 {
		t.Fatalf("%v allocs updating a present key by bytes", n)
	}
}

// Concurrent offers keep the heap consistent: no duplicates, at most k, and
// the largest offered values win.
func TestTopKConcurrent(t *testing.T) {
	top := epochsketch.NewTopK(10)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				top.Offer(fmt.Sprint("k", i%100), uint32(i%100+g))
			}
		}()
	}
	wg.Wait()
	l := top.List()
	seen := map[string]bool{}
	for _, e := range l {
		if seen[e.Key] {
			t.Fatalf("duplicate %s in %v", e.Key, l)
		}
		seen[e.Key] = true
	}
	if len(l) != 10 || l[len(l)-1].Estimate < 90 {
		t.Fatalf("List = %v: want the 10 largest (k90..k99)", l)
	}
}

// BenchmarkTopKOffer is the common path beside Observe on Zipf: most offers
// are below the floor or between sampling steps. impl=observe is Observe
// alone, impl=observe+offer feeds Offer by hand, impl=topk.observe is the
// bound TopK's one call.
func BenchmarkTopKOffer(b *testing.B) {
	w := benchWorkloads()[0]
	for _, impl := range []string{"observe", "observe+offer", "topk.observe"} {
		b.Run("impl="+impl, func(b *testing.B) {
			sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
			defer sk.Close()
			top := epochsketch.NewTopKFor(sk, 100)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				k := w.String(i)
				switch impl {
				case "observe":
					sk.Observe(k)
				case "observe+offer":
					est, _ := sk.Observe(k)
					top.Offer(k, est)
				default:
					top.Observe(k)
				}
				i++
			}
		})
	}
}
