package limit_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/keystream"
	"github.com/epochsketch/epochsketch/limit"
)

var sink uint64

// allowImpls are BenchmarkAllow's rows on workload w, on one table size
// (4 MiB) and one tick (50 ms). "allow" has a limit no key reaches
// (4,000,000 per 50 ms, whose tick is 50 ms), so every call adds;
// "allow-refused" one every key passes at once (1 per hour), so nearly
// every call is a refusal, which writes nothing. Observe's rows use the
// default hash and the limiter's, SipHash-1-3, and the same 50 ms tick as
// "allow", which keeps the hot key below MaxCount.
func allowImpls(b *testing.B) []allowImpl {
	const tick = 50 * time.Millisecond
	observe := func(h epochsketch.HashKind) func(string) bool {
		sk := epochsketch.New(epochsketch.Config{NumBuckets: 1 << 16, TickDuration: tick, Hash: h})
		b.Cleanup(func() { sk.Close() })
		return func(k string) bool { e, _ := sk.Observe(k); return e > 0 }
	}
	allow := func(requests int, per time.Duration) func(string) bool {
		l := limit.NewWith(limit.Config{Requests: requests, Per: per, NumBuckets: 1 << 16})
		b.Cleanup(func() { l.Close() })
		return l.Allow
	}
	return []allowImpl{
		{"observe", func() func(string) bool { return observe(epochsketch.HashWyhash) }},
		{"observe-siphash13", func() func(string) bool { return observe(epochsketch.HashSipHash13) }},
		{"allow", func() func(string) bool { return allow(4_000_000, tick) }},
		{"allow-refused", func() func(string) bool { return allow(1, time.Hour) }},
	}
}

type allowImpl struct {
	name string
	mk   func() func(string) bool
}

// warmed is im's function with its table warmed by the first 2^20 keys of w.
func warmed(im allowImpl, w *keystream.Stream) func(string) bool {
	f := im.mk()
	for i := range 1 << 20 {
		f(w.String(i))
	}
	return f
}

// BenchmarkAllow sets Allow beside Observe (allowImpls), in one run:
// compare with benchstat -col /impl.
func BenchmarkAllow(b *testing.B) {
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
		for _, im := range allowImpls(b) {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", w.Name, im.name), func(b *testing.B) {
				f := warmed(im, w)
				runtime.GC()
				b.ReportAllocs()
				var n uint64
				i := 1 << 20
				for b.Loop() {
					if f(w.String(i)) {
						n++
					}
					i++
				}
				sink += n
			})
		}
	}
}

// BenchmarkAllowTurns runs BenchmarkAllow's rows by turns, 256 calls each
// on the same keys, timed apart: on a shared host, load that comes and goes
// falls on every row alike, where BenchmarkAllow's rows run one after
// another and drift apart (by up to 20% between two runs of one binary
// here). It reports each row's ns per call, the ratios of Allow to
// Observe with the default hash and with SipHash-1-3, and that of the two
// Observes (the keyed hash's own cost); ns/op is one turn of all four
// rows. The four tables share the caches, so on Zipf each row reads
// slower than alone.
func BenchmarkAllowTurns(b *testing.B) {
	const turn = 256
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
		b.Run("workload="+w.Name, func(b *testing.B) {
			ims := allowImpls(b)
			fs := make([]func(string) bool, len(ims))
			for k, im := range ims {
				fs[k] = warmed(im, w)
			}
			runtime.GC()
			b.ReportAllocs()
			spent := make([]time.Duration, len(fs))
			var n uint64
			i := 1 << 20
			for b.Loop() {
				for k, f := range fs {
					t0 := time.Now()
					for j := range turn {
						if f(w.String(i + j)) {
							n++
						}
					}
					spent[k] += time.Since(t0)
				}
				i += turn
			}
			sink += n
			for k, im := range ims {
				b.ReportMetric(float64(spent[k])/float64(b.N*turn), "ns/"+im.name)
			}
			b.ReportMetric(float64(spent[2])/float64(spent[0]), "allow/observe")
			b.ReportMetric(float64(spent[2])/float64(spent[1]), "allow/observe-siphash13")
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "observe-siphash13/observe")
		})
	}
}

// TestAllowAllocs: Allow, AllowBytes, AllowN and Decide allocate nothing,
// admitted or refused; Allow(string(b)) does (the key escapes into the
// sketch's hash, so the conversion copies to the heap): AllowBytes is
// there for keys held in bytes, and reads the same count.
func TestAllowAllocs(t *testing.T) {
	l := limit.NewWith(limit.Config{Requests: 1, Per: time.Hour})
	defer l.Close()
	key := []byte("192.0.2.1")
	if n := testing.AllocsPerRun(100, func() {
		l.Allow("192.0.2.1")
		l.AllowBytes(key)
		l.AllowN(time.Time{}, "192.0.2.2", 1)
		l.Decide(time.Time{}, "192.0.2.3", 1)
	}); n != 0 {
		t.Fatalf("%.1f allocations a call, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { l.Allow(string(key)) }); n != 1 {
		t.Errorf("Allow(string(b)) allocated %.1f times, want 1 (else AllowBytes is not needed)", n)
	}
	// One key space: the 2 × 1 burst was spent by both forms together.
	if l.Allow("192.0.2.1") || l.AllowBytes(key) || !l.AllowBytes([]byte("192.0.2.9")) {
		t.Fatalf("AllowBytes and Allow do not share the key space")
	}
}
