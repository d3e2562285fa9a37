package epochsketch

import (
	"time"
	"unsafe"
)

// Internals reached by the black-box tests in package epochsketch_test.

const (
	CountMax       = countMax
	EpochMask      = epochMask
	SlotsPerBucket = slotsPerBucket
	BucketSize     = bucketSize
	CacheLine      = cacheLine
)

var (
	Pack      = pack
	TagOf     = tagOf
	EpochOf   = epochOf
	CountOf   = countOf
	Decay     = decay
	TickOf    = tickOf
	Splitmix  = splitmix64
	StatShard = unsafe.Sizeof(statShard{})
	ClockSize = unsafe.Sizeof(clockState{})
	SaltSize  = unsafe.Sizeof(saltState{})
)

func SipHash13(p []byte, k0, k1 uint64) uint64       { return sipHash13(p, newSipKey(k0, k1)) }
func SipHash13String(p string, k0, k1 uint64) uint64 { return sipHash13(p, newSipKey(k0, k1)) }
func Wyhash(p []byte, seed uint64) uint64            { return wyhash(p, seed) }
func WyhashString(p string, seed uint64) uint64      { return wyhash(p, seed) }

// HashString is the sketch's hash of a key.
func (s *Sketch) HashString(k string) uint64 { return s.h.str(k) }
func (s *Sketch) HashBytes(k []byte) uint64  { return s.h.bytes(k) }

// Buckets returns the indexes of the buckets that hash h maps to.
func (s *Sketch) Buckets(h uint64) []int {
	v := s.viewOf(h)
	out := []int{int(v.shard)}
	if v.n > slotsPerBucket {
		out = append(out, int((uintptr(unsafe.Pointer(v.b[1]))-uintptr(unsafe.Pointer(&s.table[0])))/uintptr(bucketSize)))
	}
	return out
}

// Word returns slot j of bucket i; SetWord stores it (tests build states).
func (s *Sketch) Word(i, j int) uint64       { return s.table[i].s[j].Load() }
func (s *Sketch) SetWord(i, j int, w uint64) { s.table[i].s[j].Store(w) }

// TableAddr is the address of the first bucket, for the alignment test.
func (s *Sketch) TableAddr() uintptr { return uintptr(unsafe.Pointer(&s.table[0])) }

// ObserveHashAt runs the write path for hash h at tick now, as a caller that
// read the tick earlier would (a straggler).
func (s *Sketch) ObserveHashAt(h uint64, now int64) (uint32, bool) { return s.observe(h, now, 1) }
func (s *Sketch) EstimateHashAt(h uint64, now int64) uint32        { return s.estimate(h, now) }
func (s *Sketch) HighWater() int64                                 { return s.clk.hw.Load() }
func (s *Sketch) WallTicking() bool                                { return s.clk.wall.Load() }

// Retry runs refresh's retry on slot j of bucket b for hash h at the
// current tick, as a caller whose CAS there just lost would.
func (s *Sketch) Retry(b, j int, h uint64, wt uint32) (est uint32, tried int) {
	now := s.clk.hw.Load()
	return retry(&s.table[b].s[j], j, uint64(tagFrom(h)), uint64(epoch24(now)), wt, now)
}

// Dedupe runs the post-claim check as a claimer of slot j of bucket b would.
func (s *Sketch) Dedupe(h uint64, j int) {
	v := s.viewOf(h)
	s.dedupe(&v, j, tagFrom(h))
}

// ObserveMany is the batch form measured by BenchmarkObserveMany and left
// out of the API (docs/EXPERIMENTS.md, "A batch form"): Observe for each of keys
// in order, writing the estimates to est. The buckets of up to 8 keys are
// loaded first, so that their cache misses overlap, then each key is
// observed.
func (s *Sketch) ObserveMany(keys []string, est []uint32) {
	var hs [8]uint64
	for len(keys) > 0 {
		n := min(len(keys), len(hs))
		for i := range n {
			h := s.h.str(keys[i])
			hs[i] = h
			if !s.twoChoice {
				s.table[s.first(h)].s[0].Load()
			}
		}
		now := s.now()
		for i := range n {
			est[i], _ = s.observe(hs[i], now, 1)
		}
		keys, est = keys[n:], est[n:]
	}
}

// Backoff is the wait after a lost CAS, for BenchmarkBackoff.
var Backoff = backoff

// AdmitAfterMiss runs admit's path after refresh for key, as a caller
// whose refresh read a miss before a racer claimed a slot for the key
// would: observeBucket with miss set.
func (s *Sketch) AdmitAfterMiss(key string, n, limit uint32) (uint32, bool) {
	h := s.h.str(key)
	i := s.first(h)
	est, ok, _ := unmark(s.observeBucket(&s.table[i], i, h, s.now(), n, 0, true, limit, 1))
	return est, ok
}

// AdmitExhausted ends admit's path for key as a call whose 4
// compare-and-swaps were all lost would: observe1 with no attempt left.
func (s *Sketch) AdmitExhausted(key string, n, limit uint32) (uint32, bool) {
	h := s.h.str(key)
	i := s.first(h)
	est, ok, _ := unmark(s.observe1(&s.table[i], i, h, s.now(), n, maxAttempts, limit, 1))
	return est, ok
}

// Admit is the conditional add package limit reaches through internal/admit.
func (s *Sketch) Admit(t time.Time, key string, n, limit uint32) (uint32, bool) {
	add, _ := s.admitFuncs()
	r, ok := add(t, key, n, limit)
	return r.Est, ok
}

// ScaleDown is smooth.go's scaleDown, for TestScaleDownExact.
var ScaleDown = scaleDown
