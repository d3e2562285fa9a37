package epochsketch_test

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/floor"
	"github.com/epochsketch/epochsketch/internal/keystream"
)

// workload is a key stream generated before timing (internal/keystream).
type workload = keystream.Stream

var (
	workloadsOnce sync.Once
	workloads     []*workload
)

func benchWorkloads() []*workload {
	workloadsOnce.Do(func() {
		workloads = []*workload{keystream.Zipf(1), keystream.Uniform(1), keystream.Hot()}
		runtime.GC() // collect the construction garbage before any timing
	})
	return workloads
}

const tableBuckets = 1 << 16 // 4 MiB

// configFor is Config c for a sketch on the workload named workload. The
// hot key ticks every 100 ms: at 15 to 20 ns a call, 300 ms of one 1 s tick
// would take it to MaxCount, where a refresh returns the same count
// whatever the word held, so in latency mode the next call would no longer
// wait for the load and the row would not time what it says; and where
// goroutines share it, a CAS that rewrites MaxCount with the same word
// cannot lose, so contention would not show.
func configFor(workload string, c epochsketch.Config) epochsketch.Config {
	if workload == "hot" {
		c.TickDuration = 100 * time.Millisecond
	}
	return c
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
			{"floor-hash-cas", func() func(string) uint64 { return floor.New(floor.HashCAS, tableBuckets).Observe }},
			{"floor-hash-bucket-cas", func() func(string) uint64 { return floor.New(floor.HashBucketCAS, tableBuckets).Observe }},
			{"observe", func() func(string) uint64 {
				sk := epochsketch.New(configFor(w.Name, epochsketch.Config{NumBuckets: tableBuckets}))
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"observe-maphash", func() func(string) uint64 {
				sk := epochsketch.New(configFor(w.Name, epochsketch.Config{NumBuckets: tableBuckets, Hash: epochsketch.HashMaphash}))
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"observe-siphash13", func() func(string) uint64 {
				sk := epochsketch.New(configFor(w.Name, epochsketch.Config{NumBuckets: tableBuckets, Hash: epochsketch.HashSipHash13}))
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"observe-twochoice", func() func(string) uint64 {
				sk := epochsketch.New(configFor(w.Name, epochsketch.Config{NumBuckets: tableBuckets, TwoChoice: true}))
				b.Cleanup(func() { sk.Close() })
				return func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
			}},
			{"estimate", func() func(string) uint64 {
				sk := epochsketch.New(configFor(w.Name, epochsketch.Config{NumBuckets: tableBuckets}))
				b.Cleanup(func() { sk.Close() })
				for i := range 1 << 20 {
					sk.Observe(w.String(i))
				}
				return func(k string) uint64 { return uint64(sk.Estimate(k)) }
			}},
		}
		for _, mode := range []string{"throughput", "latency"} {
			for _, im := range impls {
				b.Run(fmt.Sprintf("workload=%s/mode=%s/impl=%s", w.Name, mode, im.name), func(b *testing.B) {
					f := im.mk()
					for i := range 1 << 20 { // warm the table
						f(w.String(i))
					}
					runtime.GC()
					b.ReportAllocs()
					var s uint64
					i := 1 << 20
					if mode == "throughput" {
						// Independent calls: the CPU overlaps consecutive
						// calls' cache misses, as in a tight loop.
						for b.Loop() {
							s += f(w.String(i))
							i++
						}
					} else {
						// Each key depends on the previous answer, so no two
						// calls overlap: the cost of one call in a program
						// that does other work between calls.
						sat := 0
						for b.Loop() {
							r := f(w.String(i))
							s += r
							i += 1 + int(r>>63)
							if r == epochsketch.MaxCount {
								sat++
							}
						}
						if sat > 0 && !strings.HasPrefix(im.name, "floor") {
							// Shown, so that a saturated row (configFor)
							// cannot pass for a faster call.
							b.ReportMetric(float64(sat)/float64(b.N), "saturated/op")
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
	disjoint := keystream.Disjoint(1024) // 1024 hot keys per goroutine slot
	cases := []struct {
		name string
		key  func(g, i int) string
	}{
		{"zipf1.1-1M", func(g, i int) string { return ws[0].String(i + g*7919) }},
		{"disjoint", func(g, i int) string { return disjoint.String((g%64)*1024 + i%1024) }},
		{"hot", func(g, i int) string { return ws[2].String(0) }},
	}
	for _, c := range cases {
		for _, impl := range []string{"floor-hash-cas", "observe", "observe-twochoice"} {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", c.name, impl), func(b *testing.B) {
				var f func(string) uint64
				var sk *epochsketch.Sketch
				if impl == "floor-hash-cas" {
					f = floor.New(floor.HashCAS, tableBuckets).Observe
				} else {
					sk = epochsketch.New(configFor(c.name, epochsketch.Config{NumBuckets: tableBuckets, TwoChoice: impl == "observe-twochoice"}))
					defer sk.Close()
					f = func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
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
				if sk != nil {
					// Increments dropped after 4 lost CASes, per call: what
					// contention costs in accuracy rather than time.
					b.ReportMetric(float64(sk.Stats().CASRetriesExhausted)/float64(b.N), "drops/op")
				}
			})
		}
	}
}

// BenchmarkObserveContended times single calls while b.RunParallel's
// goroutines share one hot key (run it with -cpu 2 or more): what a call
// that loses its CAS and backs off costs the caller. About 2^17 calls,
// spread evenly over the run, are timed with time.Now, whose own cost
// (tens of ns) is in every figure; it reports the median, the 99th and the
// 99.9th percentile and the slowest timed call, in ns.
func BenchmarkObserveContended(b *testing.B) {
	sk := epochsketch.New(configFor("hot", epochsketch.Config{NumBuckets: tableBuckets}))
	defer sk.Close()
	key := benchWorkloads()[2].String(0)
	b.ResetTimer()
	stride := max(1, b.N>>17)
	var mu sync.Mutex
	var all []int64
	b.RunParallel(func(pb *testing.PB) {
		lat := make([]int64, 0, 1<<17)
		for i := 0; pb.Next(); i++ {
			if i%stride != 0 || len(lat) == cap(lat) {
				sk.Observe(key)
				continue
			}
			t := time.Now()
			sk.Observe(key)
			lat = append(lat, int64(time.Since(t)))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	})
	b.StopTimer()
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	q := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) }
	b.ReportMetric(q(0.5), "p50-ns")
	b.ReportMetric(q(0.99), "p99-ns")
	b.ReportMetric(q(0.999), "p99.9-ns")
	b.ReportMetric(q(1), "max-ns")
}

// BenchmarkBackoff is the first wait after a lost CAS on a key's slot
// (docs/DESIGN.md, Dropped updates): about 0.75 µs on the Intel host.
func BenchmarkBackoff(b *testing.B) {
	for b.Loop() {
		epochsketch.Backoff(1)
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

// BenchmarkSnapshot measures WriteTo and ReadFrom on a 64 MiB table (1<<20
// buckets): MB/s is the throughput (benchstat shows B/s).
func BenchmarkSnapshot(b *testing.B) {
	cfg := epochsketch.Config{NumBuckets: 1 << 20, Hash: epochsketch.HashWyhash, Seed: 1}
	sk := epochsketch.New(cfg)
	defer sk.Close()
	w := benchWorkloads()[0]
	for i := range 1 << 21 {
		sk.Observe(w.String(i))
	}
	data, err := marshal(sk)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("op=write", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := sk.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("op=read", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		dst := epochsketch.New(cfg)
		defer dst.Close()
		for b.Loop() {
			if _, err := dst.ReadFrom(bytes.NewReader(data)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkObserveDuringSnapshot is Observe's latency (each call waits for
// the previous one) on the Zipf stream, with another goroutine writing
// snapshots of the same 64 MiB sketch back to back, or idle: compare with
// benchstat -col /snapshot. The snapshot takes no lock and stops no writer.
func BenchmarkObserveDuringSnapshot(b *testing.B) {
	w := benchWorkloads()[0]
	for _, snap := range []string{"off", "on"} {
		b.Run("snapshot="+snap, func(b *testing.B) {
			sk := epochsketch.New(epochsketch.Config{NumBuckets: 1 << 20, Hash: epochsketch.HashWyhash, Seed: 1})
			defer sk.Close()
			for i := range 1 << 20 {
				sk.Observe(w.String(i))
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var snaps atomic.Int64
			if snap == "on" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						sk.WriteTo(io.Discard)
						snaps.Add(1)
					}
				}()
			}
			var s uint64
			i := 1 << 20
			for b.Loop() {
				r, _ := sk.Observe(w.String(i))
				s += uint64(r)
				i += 1 + int(r>>31)
			}
			close(stop)
			wg.Wait()
			sink += s
			b.ReportMetric(float64(snaps.Load()), "snapshots")
		})
	}
}

// BenchmarkObserveMany replays a stream in batches of 64 keys: one Observe
// per key, or the batch form that loads the buckets of 8 keys before
// observing them. Compare with benchstat -col /impl.
func BenchmarkObserveMany(b *testing.B) {
	for _, w := range benchWorkloads() {
		for _, impl := range []string{"single", "batch"} {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", w.Name, impl), func(b *testing.B) {
				sk := epochsketch.New(epochsketch.Config{NumBuckets: tableBuckets})
				defer sk.Close()
				for i := range 1 << 20 {
					sk.Observe(w.String(i))
				}
				keys := make([]string, 64)
				est := make([]uint32, 64)
				runtime.GC()
				b.ReportAllocs()
				i := 1 << 20
				for b.Loop() {
					for k := range keys {
						keys[k] = w.String(i + k)
					}
					i += len(keys)
					if impl == "single" {
						for k, key := range keys {
							est[k], _ = sk.Observe(key)
						}
					} else {
						sk.ObserveMany(keys, est)
					}
					sink += uint64(est[0])
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
			})
		}
	}
}
