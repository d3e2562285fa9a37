package epochsketch_test

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/epochsketch/epochsketch"
)

// keySet holds n keys in one pointer-free buffer, so the garbage collector
// never rescans them and no benchmark pays for their allocation.
type keySet struct {
	buf []byte
	off []uint32 // key i is buf[off[i]:off[i+1]]
}

func makeKeys(n int, prefix string) *keySet {
	ks := &keySet{off: make([]uint32, 0, n+1)}
	for i := range n {
		ks.off = append(ks.off, uint32(len(ks.buf)))
		ks.buf = append(ks.buf, prefix...)
		ks.buf = strconv.AppendUint(ks.buf, uint64(i)*2654435761%(1<<32), 16)
	}
	ks.off = append(ks.off, uint32(len(ks.buf)))
	return ks
}

func (ks *keySet) bytes(i uint32) []byte { return ks.buf[ks.off[i]:ks.off[i+1]:ks.off[i+1]] }

// str views key i as a string without copying; the buffer is never written
// after makeKeys.
func (ks *keySet) str(i uint32) string {
	b := ks.bytes(i)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// workload is a stream of keys, generated before timing and laid out in
// the order they are consumed: reading the next key is a sequential read,
// so the benchmark measures the structure, not key fetches.
type workload struct {
	name string
	keys *keySet
}

var (
	workloadsOnce sync.Once
	workloads     []*workload
)

// streamOf lays out the keys of ids, in order, in one buffer.
func streamOf(prefix string, ids []uint32) *keySet {
	ks := &keySet{off: make([]uint32, 0, len(ids)+1)}
	for _, id := range ids {
		ks.off = append(ks.off, uint32(len(ks.buf)))
		ks.buf = append(ks.buf, prefix...)
		ks.buf = strconv.AppendUint(ks.buf, uint64(id)*2654435761%(1<<32), 16)
	}
	ks.off = append(ks.off, uint32(len(ks.buf)))
	return ks
}

func benchWorkloads() []*workload {
	workloadsOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		// Zipf(1.1) over 1M keys: a realistic skew.
		z := rand.NewZipf(r, 1.1, 1, 1_000_000-1)
		zs := make([]uint32, 1<<22)
		for i := range zs {
			zs[i] = uint32(z.Uint64())
		}
		// A uniform flood over 10M distinct keys: every call misses.
		us := make([]uint32, 10_000_000)
		for i := range us {
			us[i] = uint32(i)
		}
		r.Shuffle(len(us), func(i, j int) { us[i], us[j] = us[j], us[i] })
		workloads = []*workload{
			{"zipf1.1-1M", streamOf("api_client:", zs)},
			{"uniform-10M", streamOf("flood:", us)},
			{"hot", streamOf("hot:", []uint32{0})},
		}
		runtime.GC() // collect the construction garbage before any timing
	})
	return workloads
}

func (w *workload) at(i int) uint32 { return uint32(i % (len(w.keys.off) - 1)) }

const tableBuckets = 1 << 16 // 4 MiB

// floorCAS is the first physical floor: a seeded maphash and one atomic CAS
// on a 4 MiB table of words.
type floorCAS struct {
	seed  maphash.Seed
	words []atomic.Uint64
}

func newFloorCAS() *floorCAS {
	return &floorCAS{seed: maphash.MakeSeed(), words: make([]atomic.Uint64, tableBuckets*8)}
}

func (f *floorCAS) observe(k string) uint64 {
	h := maphash.String(f.seed, k)
	w := &f.words[(h>>32)*uint64(len(f.words))>>32]
	x := w.Load()
	w.CompareAndSwap(x, x+1)
	return x
}

// floorBucket is the second floor: hash, read all 8 words of a 64-byte
// bucket, CAS the one whose tag matches (or the first).
type floorBucket struct {
	seed    maphash.Seed
	buckets [][8]atomic.Uint64
}

func newFloorBucket() *floorBucket {
	return &floorBucket{seed: maphash.MakeSeed(), buckets: make([][8]atomic.Uint64, tableBuckets)}
}

func (f *floorBucket) observe(k string) uint64 {
	h := maphash.String(f.seed, k)
	b := &f.buckets[(h>>32)*uint64(len(f.buckets))>>32]
	tag := h >> 48
	j := 0
	var x uint64
	for i := range b {
		if w := b[i].Load(); w>>48 == tag {
			j, x = i, w
		}
	}
	b[j].CompareAndSwap(x, tag<<48|(x+1)&(1<<48-1))
	return x
}

var sink uint64

// BenchmarkObserve sets Observe beside the floors on one stream, in one run:
// compare with benchstat -col /impl. Two modes: throughput (independent
// calls in a tight loop) and latency (each call waits for the previous one).
func BenchmarkObserve(b *testing.B) {
	for _, w := range benchWorkloads() {
		impls := []struct {
			name string
			mk   func() func(string) uint64
		}{
			{"floor-hash-cas", func() func(string) uint64 { return newFloorCAS().observe }},
			{"floor-hash-bucket-cas", func() func(string) uint64 { return newFloorBucket().observe }},
			{"observe", func() func(string) uint64 {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"observe-siphash13", func() func(string) uint64 {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets, Hash: epochsketch.HashSipHash13})
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"observe-twochoice", func() func(string) uint64 {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets, TwoChoice: true})
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"estimate", func() func(string) uint64 {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
				b.Cleanup(func() { sk.Close() })
				for i := range 1 << 20 {
					sk.Observe(w.keys.str(w.at(i)))
				}
				return func(k string) uint64 { return uint64(sk.Estimate(k)) }
			}},
		}
		for _, mode := range []string{"throughput", "latency"} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("workload=%s/mode=%s/impl=%s", w.name, mode, im.name), func(b *testing.B) {
					f := im.mk()
					for i := range 1 << 20 { // warm the table
						f(w.keys.str(w.at(i)))
					}
					runtime.GC()
					b.ReportAllocs()
					var s uint64
					i := 1 << 20
					if mode == "throughput" {
						// Independent calls: the CPU overlaps consecutive
						// calls' cache misses, as in a tight loop.
						for b.Loop() {
							s += f(w.keys.str(w.at(i)))
							i++
						}
					} else {
						// Each key depends on the previous answer, so no two
						// calls overlap: the cost of one call in a program
						// that does other work between calls.
						for b.Loop() {
							r := f(w.keys.str(w.at(i)))
							s += r
							i += 1 + int(r>>63)
						}
					}
					sink += s
				})
			}
		}
	}
}

// BenchmarkObserveParallel measures throughput with b.RunParallel; run it with
// -cpu 1,2. ns/op is wall time per operation across all goroutines, so
// perfect scaling halves it at -cpu 2.
func BenchmarkObserveParallel(b *testing.B) {
	ws := benchWorkloads()
	disjoint := makeKeys(64*1024, "tenant:") // 1024 hot keys per goroutine slot
	cases := []struct {
		name string
		key  func(g, i int) string
	}{
		{"zipf1.1-1M", func(g, i int) string { return ws[0].keys.str(ws[0].at(i + g*7919)) }},
		{"disjoint", func(g, i int) string { return disjoint.str(uint32((g%64)*1024 + i%1024)) }},
		{"hot", func(g, i int) string { return ws[2].keys.str(0) }},
	}
	for _, c := range cases {
		for _, impl := range []string{"floor-hash-cas", "observe"} {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", c.name, impl), func(b *testing.B) {
				var f func(string) uint64
				if impl == "observe" {
					sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
					defer sk.Close()
					f = func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
				} else {
					f = newFloorCAS().observe
				}
				var next atomic.Int64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					g := int(next.Add(1))
					var s uint64
					i := 0
					for pb.Next() {
						s += f(c.key(g, i))
						i++
					}
					atomic.AddUint64(&sink, s)
				})
			})
		}
	}
}

// BenchmarkLiveHeap reports the live heap after observing n distinct keys:
// NumBuckets × 64 B plus a constant, whatever n.
func BenchmarkLiveHeap(b *testing.B) {
	for _, n := range []int{0, 100_000, 1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("distinct=%d", n), func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
				key := make([]byte, 0, 32)
				for i := range n {
					key = strconv.AppendInt(append(key[:0], "distinct:"...), int64(i), 10)
					sk.ObserveBytes(key)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "live-MiB")
				runtime.KeepAlive(sk)
				sk.Close()
			}
		})
	}
}
