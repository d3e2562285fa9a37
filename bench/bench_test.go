package bench

import (
	"bytes"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/epochsketch/epochsketch/internal/keystream"
)

var (
	streamsOnce sync.Once
	streams     []*keystream.Stream
)

// benchStreams are the workloads, generated before any timing. The King
// James stream needs Debian's bible-kjv (scripts/bench.sh installs it).
func benchStreams(b *testing.B) []*keystream.Stream {
	streamsOnce.Do(func() {
		streams = []*keystream.Stream{keystream.Zipf(1), keystream.Uniform(1), keystream.Hot()}
		if out, err := exec.Command("bible", "gen1:1-rev22:21").Output(); err == nil {
			words := strings.FieldsFunc(string(bytes.ToLower(out)), func(r rune) bool { return !unicode.IsLetter(r) })
			streams = append(streams, keystream.FromWords("kjv", words))
		}
		runtime.GC()
	})
	if len(streams) < 4 {
		b.Logf("the King James workload is left out: install Debian's bible-kjv (scripts/bench.sh does)")
	}
	return streams
}

var sink atomic.Uint64

// BenchmarkPeers runs every peer on every stream, single-threaded, warmed
// with 2^20 calls; compare with benchstat -col /impl.
func BenchmarkPeers(b *testing.B) {
	for _, s := range benchStreams(b) {
		for _, p := range Peers {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", s.Name, p.Name), func(b *testing.B) {
				c := p.New()
				for i := range 1 << 20 {
					c.Observe(s.String(i))
				}
				runtime.GC()
				b.ReportAllocs()
				var sum uint64
				i := 1 << 20
				for b.Loop() {
					sum += uint64(c.Observe(s.String(i)))
					i++
				}
				sink.Add(sum)
			})
		}
	}
}

// BenchmarkPeersParallel runs every peer under b.RunParallel (use -cpu 1,2):
// ns/op is wall time per operation across all goroutines.
func BenchmarkPeersParallel(b *testing.B) {
	ss := benchStreams(b)
	disjoint := keystream.Disjoint(1024)
	cases := []struct {
		name string
		key  func(g, i int) string
	}{
		{"zipf1.1-1M", func(g, i int) string { return ss[0].String(i + g*7919) }},
		{"disjoint", func(g, i int) string { return disjoint.String((g%64)*1024 + i%1024) }},
		{"hot", func(g, i int) string { return ss[2].String(0) }},
	}
	for _, c := range cases {
		for _, p := range Peers {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", c.name, p.Name), func(b *testing.B) {
				ctr := p.New()
				var next atomic.Int64
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					g := int(next.Add(1))
					var sum uint64
					i := 0
					for pb.Next() {
						sum += uint64(ctr.Observe(c.key(g, i)))
						i++
					}
					sink.Add(sum)
				})
			})
		}
	}
}

// BenchmarkLiveHeap ingests the first N of the uniform flood's 10M distinct
// keys into each peer and reports the live heap it holds afterwards and the
// ingest cost per key.
func BenchmarkLiveHeap(b *testing.B) {
	s := benchStreams(b)[1] // 10M distinct keys
	for _, n := range []int{100_000, 1_000_000, 10_000_000} {
		for _, p := range Peers {
			b.Run(fmt.Sprintf("keys=%d/impl=%s", n, p.Name), func(b *testing.B) {
				for b.Loop() {
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					c := p.New()
					for i := range n {
						c.Observe(s.String(i))
					}
					runtime.GC()
					runtime.ReadMemStats(&after)
					b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "live-MiB")
					runtime.KeepAlive(c)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/key")
			})
		}
	}
}

// BenchmarkLimiters sets package limit beside the per-key limiters Go
// programs use instead, in one run: ns per Allow at 100 per second on the
// Zipf and hot-key streams (wall clock, warmed with 2^20 calls), the live
// heap after 1M distinct keys, and the rate a client sending at 2x and 4x
// a limit of 10 per second is admitted at over a minute, replayed at
// explicit times from a whole second.
func BenchmarkLimiters(b *testing.B) {
	ss := benchStreams(b)
	for _, s := range []*keystream.Stream{ss[0], ss[2]} {
		for _, p := range LimiterPeers {
			b.Run(fmt.Sprintf("case=allow/workload=%s/impl=%s", s.Name, p.Name), func(b *testing.B) {
				l := p.New(100, time.Second)
				for i := range 1 << 20 {
					l.Allow(s.String(i))
				}
				runtime.GC()
				b.ReportAllocs()
				n := 0
				i := 1 << 20
				for b.Loop() {
					if l.Allow(s.String(i)) {
						n++
					}
					i++
				}
				sink.Add(uint64(n))
			})
		}
	}
	for _, p := range LimiterPeers {
		b.Run(fmt.Sprintf("case=heap/keys=1000000/impl=%s", p.Name), func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				l := p.New(100, time.Second)
				for i := range 1_000_000 {
					l.Allow(ss[1].String(i))
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "live-MiB")
				runtime.KeepAlive(l)
			}
		})
	}
	for _, over := range []int{2, 4} {
		for _, p := range LimiterPeers {
			b.Run(fmt.Sprintf("case=admitted/over=%dx/impl=%s", over, p.Name), func(b *testing.B) {
				for b.Loop() {
					b.ReportMetric(Admitted(p, 10, over, time.Unix(1_800_000_000, 0), time.Minute), "admitted/s")
				}
			})
		}
	}
}
