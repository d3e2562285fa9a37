package epochsketch

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/internal/floor"
	"github.com/epochsketch/epochsketch/internal/keystream"
)

var partsSink uint64

// BenchmarkObserveParts takes Observe's latency apart (each call waits for
// the previous answer, as in BenchmarkObserve's latency mode), one step at
// a time on the default 4 MiB table, beside the hash+CAS floor:
//
//   - home-load: the key's hash, its bucket and the word in its home slot,
//     returned as it is: what any design of this shape reads;
//   - home-tag: that word's count plus one when its tag is the key's, else
//     0: a design that tells keys apart, and so takes a branch the CPU
//     mispredicts on every key the table does not hold;
//   - home-tag-cas: home-tag, and the CAS of the new count into the word;
//   - home-tag-mask: home-tag, confirmed by the match mask of all 8 slots
//     (the key there alone), without the CAS;
//   - refresh: the whole fast path (the mask, the age, the CAS), 0 for any
//     call it leaves to the rest of Observe;
//   - observe: Observe.
//
// All the parts of one workload run on one table, warmed by Observe alone,
// and the floor on one table of its own: a fresh table per part adds the
// noise of where its pages land in the caches to every step. The parts
// write nothing but counts (what refresh and Observe write), so the table
// stays as warm as Observe leaves it. The hot key's sketch ticks every
// 100 ms, as BenchmarkObserve's does (configFor there): within a 1 s tick
// it would reach MaxCount, where a refresh returns a constant that the
// next call does not wait for.
func BenchmarkObserveParts(b *testing.B) {
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
		cfg := Config{NumBuckets: 1 << 16}
		if w.Name == "hot" {
			cfg.TickDuration = 100 * time.Millisecond
		}
		sk := New(cfg)
		fl := floor.New(floor.HashCAS, 1<<16)
		for i := range 1 << 20 {
			sk.Observe(w.String(i))
			fl.Observe(w.String(i))
		}
		for _, part := range []string{"floor-hash-cas", "home-load", "home-tag", "home-tag-cas", "home-tag-mask", "refresh", "observe"} {
			b.Run(fmt.Sprintf("workload=%s/part=%s", w.Name, part), func(b *testing.B) {
				var f func(string) uint64
				switch part {
				case "floor-hash-cas":
					f = fl.Observe
				case "home-load":
					f = func(k string) uint64 {
						h := sk.h.str(k)
						return sk.table[sk.first(h)].s[homeOf(h)].Load()
					}
				case "home-tag":
					f = func(k string) uint64 {
						h := sk.h.str(k)
						x := sk.table[sk.first(h)].s[homeOf(h)].Load()
						if x>>tagShift != uint64(tagFrom(h)) {
							return 0
						}
						return uint64(satAdd(countOf(x), 1))
					}
				case "home-tag-cas":
					f = func(k string) uint64 {
						h := sk.h.str(k)
						p := &sk.table[sk.first(h)].s[homeOf(h)]
						x := p.Load()
						if x>>tagShift != uint64(tagFrom(h)) {
							return 0
						}
						c := satAdd(countOf(x), 1)
						p.CompareAndSwap(x, x&^countMax|uint64(c))
						return uint64(c)
					}
				case "home-tag-mask":
					f = func(k string) uint64 {
						h := sk.h.str(k)
						b := &sk.table[sk.first(h)]
						j := homeOf(h)
						x := b.s[j].Load()
						tag := uint64(tagFrom(h))
						if x>>tagShift != tag || matchMask(b, tag) != 1<<j {
							return 0
						}
						return uint64(satAdd(countOf(x), 1))
					}
				case "refresh":
					f = func(k string) uint64 {
						h := sk.h.str(k)
						c, _, _, _ := refresh(&sk.table[sk.first(h)], h, sk.now(), 1, countMax)
						return uint64(c)
					}
				case "observe":
					f = func(k string) uint64 { e, _ := sk.Observe(k); return uint64(e) }
				}
				runtime.GC()
				var s uint64
				i := 1 << 20
				for b.Loop() {
					r := f(w.String(i))
					s += r
					i += 1 + int(r>>63)
				}
				partsSink += s
			})
		}
		sk.Close()
	}
}

// BenchmarkHash times the key hashes alone on the benchmarks' keys (the
// Zipf stream's 12 to 19 bytes, the hot key's 5), in a tight loop as
// BenchmarkObserve's throughput mode and package limit's BenchmarkAllow
// run: what each hash adds to a call. "kind" goes through the sketch's
// hasher, as Observe does; the others call the hash directly.
func BenchmarkHash(b *testing.B) {
	wy := hasher{kind: HashWyhash, k0: 0x1234}
	sip := hasher{kind: HashSipHash13}
	sip.setKey(0x1234, 0x5678)
	for _, w := range []*keystream.Stream{keystream.Zipf(1), keystream.Hot()} {
		for _, h := range []struct {
			name string
			f    func(w *keystream.Stream, i int) uint64
		}{
			{"wyhash", func(w *keystream.Stream, i int) uint64 { return wyhash(w.String(i), wy.k0) }},
			{"siphash13", func(w *keystream.Stream, i int) uint64 { return sipHash13(w.String(i), sip.sip) }},
			{"wyhash-kind", func(w *keystream.Stream, i int) uint64 { return wy.str(w.String(i)) }},
			{"siphash13-kind", func(w *keystream.Stream, i int) uint64 { return sip.str(w.String(i)) }},
			{"siphash13-bytes", func(w *keystream.Stream, i int) uint64 { return sipHash13(w.Bytes(i), sip.sip) }},
		} {
			b.Run(fmt.Sprintf("workload=%s/hash=%s", w.Name, h.name), func(b *testing.B) {
				var s uint64
				i := 0
				for b.Loop() {
					s += h.f(w, i)
					i++
				}
				partsSink += s
			})
		}
	}
}
