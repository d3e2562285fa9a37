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

// BenchmarkAllow sets Allow beside Observe on one table size (4 MiB) and
// one tick (50 ms), in one run: compare with benchstat -col /impl. "allow"
// has a limit no key reaches (4,000,000 per 50 ms, whose tick is 50 ms), so
// every call adds; "allow-refused" one every key passes at once (1 per
// hour), so nearly every call is a refusal, which writes nothing.
// Observe's rows use the default hash and the limiter's, SipHash-1-3, and
// the same 50 ms tick as "allow", which keeps the hot key below MaxCount.
func BenchmarkAllow(b *testing.B) {
	const tick = 50 * time.Millisecond
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
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
		impls := []struct {
			name string
			mk   func() func(string) bool
		}{
			{"observe", func() func(string) bool { return observe(epochsketch.HashWyhash) }},
			{"observe-siphash13", func() func(string) bool { return observe(epochsketch.HashSipHash13) }},
			{"allow", func() func(string) bool { return allow(4_000_000, tick) }},
			{"allow-refused", func() func(string) bool { return allow(1, time.Hour) }},
		}
		for _, im := range impls {
			b.Run(fmt.Sprintf("workload=%s/impl=%s", w.Name, im.name), func(b *testing.B) {
				f := im.mk()
				for i := range 1 << 20 { // warm the table
					f(w.String(i))
				}
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
