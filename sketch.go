package epochsketch

import (
	"crypto/rand"
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"
)

// maxAttempts is the first try plus 3 retries (docs/DESIGN.md, Dropped updates); then the increment
// is dropped and counted in Stats.CASRetriesExhausted.
const maxAttempts = 4

// Sketch is a fixed-memory, lock-free tracker of recent key frequency. Each
// key is one 64-bit slot in a 64-byte bucket; counts halve every tick,
// interpreted at read time, with no background pass over the table.
//
// The zero Sketch is not usable: create one with New. A Sketch is safe for
// concurrent use by any number of goroutines and must not be copied. With the
// default wall clock a Sketch runs one small goroutine that stores the current
// tick; Close stops it, and so does the garbage collector once the Sketch is
// unreachable.
type Sketch struct {
	_ noCopy

	table     []bucket
	nb        uint64
	pow2      bool // nb is a power of two: first shifts instead of multiplying
	nbShift   uint // 64 - log2(nb) when pow2
	h         hasher
	tick      int64 // tick duration in nanoseconds
	twoChoice bool
	lottery   lottery

	clk    *clockState
	manual *ManualClock // exact clock, read on every call
	custom Clock        // any other Clock, called on every call
	tk     *ticker      // wall-clock goroutine, nil otherwise
	clean  runtime.Cleanup

	seeded   *saltState // non-nil when Config.Seed != 0
	stats    *statTable
	overflow overflow     // admit's policy for a bucket full of keys at their limit
	sm       *smoothState // non-nil for a smooth sketch (smooth.go)
}

// New returns a Sketch for cfg. It panics with Validate's error if cfg is
// invalid; call cfg.Validate first to handle the error instead.
func New(cfg Config) *Sketch {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	cfg = cfg.withDefaults()
	s := &Sketch{
		table:     newTable(cfg.NumBuckets),
		nb:        uint64(cfg.NumBuckets),
		pow2:      bits.OnesCount64(uint64(cfg.NumBuckets)) == 1,
		nbShift:   uint(64 - bits.TrailingZeros64(uint64(cfg.NumBuckets))),
		tick:      int64(cfg.TickDuration),
		twoChoice: cfg.TwoChoice,
		lottery:   lotteryHeavyKeeper,
		clk:       new(clockState),
		stats:     new(statTable),
	}
	s.h.kind = cfg.Hash
	if cfg.Seed == 0 {
		s.h.mseed = maphash.MakeSeed()
		var k [16]byte
		_, _ = rand.Read(k[:]) // crypto/rand.Read never fails (Go 1.24)
		s.h.setKey(binary.LittleEndian.Uint64(k[:8]), binary.LittleEndian.Uint64(k[8:]))
	} else {
		k0 := splitmix64(cfg.Seed)
		s.h.setKey(k0, splitmix64(k0))
		s.seeded = &saltState{}
		s.seeded.base = splitmix64(s.h.k1)
	}
	switch c := cfg.Clock.(type) {
	case nil:
		s.tk = startTicker(s.clk, s.tick)
		tk, clk := s.tk, s.clk
		s.clean = runtime.AddCleanup(s, func(struct{}) { tk.signal(clk) }, struct{}{})
	case *ManualClock:
		s.manual = c
		s.clk.advance(tickOf(c.ns.Load(), s.tick))
	default:
		s.custom = c
		s.clk.advance(tickOf(c.Now().UnixNano(), s.tick))
	}
	if cfg.SmoothDecay {
		s.setSmooth()
	}
	return s
}

// Close stops the wall-clock goroutine, if any, and waits for it to exit. A
// Sketch keeps working after Close, but then reads the clock on every call
// (time.Now costs about 65 ns). Close is idempotent and returns nil.
func (s *Sketch) Close() error {
	if s.tk != nil {
		s.clean.Stop()
		s.tk.close(s.clk)
	}
	return nil
}

// NumBuckets returns the number of 64-byte buckets.
func (s *Sketch) NumBuckets() int { return int(s.nb) }

// TickDuration returns the tick (half-life).
func (s *Sketch) TickDuration() time.Duration { return time.Duration(s.tick) }

// Stats returns the self-metrics since New.
func (s *Sketch) Stats() Stats { return s.stats.snapshot() }

// Observe records one occurrence of key and returns its estimated recent
// frequency (this occurrence included) and whether this is its first sighting
// in the current tick.
//
// Estimates decay: a key seen c times at tick t reads c >> (now - t). Errors
// go in the safe direction (docs/DESIGN.md): a key may read low (its increment was
// dropped after 4 lost compare-and-swaps, counted in Stats), and a key that
// could not be tracked because its bucket is full of stronger keys returns
// (1, true), first-sighting treatment. A different key with the same bucket
// and 16-bit fingerprint shares the count (rare: see THEORY.md).
func (s *Sketch) Observe(key string) (estimate uint32, first bool) {
	return s.observe(s.h.str(key), s.now(), 1)
}

// ObserveBytes is Observe for a key held in a byte slice: the same key space
// as Observe(string(b)), without converting or allocating.
func (s *Sketch) ObserveBytes(key []byte) (estimate uint32, first bool) {
	return s.observe(s.h.bytes(key), s.now(), 1)
}

// ObserveN is the explicit form of Observe: n occurrences of key (a weight:
// tokens, bytes, cost units) at time t, in one compare-and-swap. The zero t
// means the sketch's clock, so ObserveN(time.Time{}, key, 1) is Observe(key).
//
// A non-zero t is for replaying timestamped records: a t later than any time
// seen so far advances the sketch's tick for every caller; a t earlier than
// that counts at the latest tick instead, so a late record never rewinds
// state.
//
// Counts saturate at MaxCount; n above MaxCount counts as MaxCount. A new key
// in a full bucket draws the lottery once per unit of weight, at most 64
// times (bounded work), each win taking one count from the weakest slot; the
// win that empties it claims the slot with the units not yet drawn. With
// n <= 64 that is exactly n calls of Observe in one (the same draws, words
// and Stats; tested). An untracked key reads (min(n, MaxCount), true). n == 0
// records nothing and returns (EstimateAt(t, key), false).
func (s *Sketch) ObserveN(t time.Time, key string, n uint32) (estimate uint32, first bool) {
	return s.observeN(t, s.h.str(key), n)
}

// ObserveBytesN is ObserveN for a key held in a byte slice.
func (s *Sketch) ObserveBytesN(t time.Time, key []byte, n uint32) (estimate uint32, first bool) {
	return s.observeN(t, s.h.bytes(key), n)
}

// observeN is ObserveN for a hashed key.
func (s *Sketch) observeN(t time.Time, h uint64, n uint32) (uint32, bool) {
	if n == 0 {
		if t.IsZero() {
			return s.estimateOf(t, h, s.peekNow()), false
		}
		return s.estimateOf(t, h, s.readAt(t)), false
	}
	if s.sm != nil {
		return s.observeSmooth(t, h, n)
	}
	return s.observe(h, s.writeAt(t), min(n, countMax))
}

// estimateOf is the estimate of hashed key h at tick now for a read at t
// (the zero t: the sketch's clock): estimate, in a smooth sketch's
// external counts where it is one.
func (s *Sketch) estimateOf(t time.Time, h uint64, now int64) uint32 {
	if s.sm != nil {
		return s.estimateSmooth(t, h, now)
	}
	return s.estimate(h, now)
}

// writeAt is the tick for a write at t: the clock's for the zero t, else t's,
// raised to the latest tick already used (and advancing it), as now does.
func (s *Sketch) writeAt(t time.Time) int64 {
	if t.IsZero() {
		return s.now()
	}
	return s.clk.advance(tickOf(t.UnixNano(), s.tick))
}

// readAt is the tick for a read at t: t's, raised to the latest tick already
// used, without advancing anything.
func (s *Sketch) readAt(t time.Time) int64 {
	return max(tickOf(t.UnixNano(), s.tick), s.clk.hw.Load())
}

// Estimate returns key's current estimated frequency without recording an
// occurrence. It never writes anything.
func (s *Sketch) Estimate(key string) uint32 {
	return s.estimateOf(time.Time{}, s.h.str(key), s.peekNow())
}

// EstimateBytes is Estimate for a key held in a byte slice.
func (s *Sketch) EstimateBytes(key []byte) uint32 {
	return s.estimateOf(time.Time{}, s.h.bytes(key), s.peekNow())
}

// EstimateAt is Estimate at time t; like ObserveN, a t older than the latest
// tick reads at the latest tick.
func (s *Sketch) EstimateAt(t time.Time, key string) uint32 {
	return s.estimateOf(t, s.h.str(key), s.readAt(t))
}

// EstimateBytesAt is EstimateAt for a key held in a byte slice.
func (s *Sketch) EstimateBytesAt(t time.Time, key []byte) uint32 {
	return s.estimateOf(t, s.h.bytes(key), s.readAt(t))
}

// now returns the tick for a write: the clock's, raised to the latest tick
// already used so that time never runs backwards for the table.
func (s *Sketch) now() int64 {
	if s.manual != nil {
		return s.clk.advance(tickOf(s.manual.ns.Load(), s.tick))
	}
	if s.clk.wall.Load() {
		return s.clk.hw.Load()
	}
	return s.clk.advance(tickOf(s.clockNow(), s.tick))
}

// peekNow is now without raising the shared tick: reads write nothing.
func (s *Sketch) peekNow() int64 {
	if s.manual != nil {
		return max(tickOf(s.manual.ns.Load(), s.tick), s.clk.hw.Load())
	}
	if s.clk.wall.Load() {
		return s.clk.hw.Load()
	}
	return max(tickOf(s.clockNow(), s.tick), s.clk.hw.Load())
}

func (s *Sketch) clockNow() int64 {
	if s.custom != nil {
		return s.custom.Now().UnixNano()
	}
	return time.Now().UnixNano()
}

// view is the slots a key may live in: one bucket, or two with TwoChoice.
type view struct {
	b     [2]*bucket
	n     int    // 8 or 16 slots
	shard uint64 // first bucket's index, for the stats stripe
}

func (v *view) at(i int) *atomic.Uint64 { return &v.b[i>>3].s[i&7] }

func (v *view) load(w *[2 * slotsPerBucket]uint64) {
	for i := 0; i < v.n; i++ {
		w[i] = v.at(i).Load()
	}
}

// viewOf maps hash h to its bucket(s). Bits 63..32 pick the bucket by
// multiply-shift (no division, any NumBuckets), bits 31..16 are the tag,
// bits 15..13 the home slot (homeOf), and the whole hash feeds the lottery.
func (s *Sketch) viewOf(h uint64) view {
	i := s.first(h)
	v := view{n: slotsPerBucket, shard: i}
	v.b[0] = &s.table[i]
	if s.twoChoice {
		if j := s.second(h); j != i {
			v.b[1] = &s.table[j]
			v.n = 2 * slotsPerBucket
		}
	}
	return v
}

// secondMix re-mixes a key's hash for its second candidate bucket with
// TwoChoice: splitmix64's first multiplier, after folding the high bits down,
// so the two choices are independent of each other.
const secondMix = 0xbf58476d1ce4e5b9

// first is the index of h's bucket: bits 63..32 scaled to NumBuckets by
// multiply-shift. For a power of two, 2^k buckets, that is exactly h's top
// k bits, taken with one shift: the same bucket a cycle or two sooner, on
// the path every estimate waits on.
func (s *Sketch) first(h uint64) uint64 {
	if s.pow2 {
		return h >> s.nbShift
	}
	return (h >> 32) * s.nb >> 32
}

// second is the index of h's second candidate bucket with TwoChoice
// (docs/DESIGN.md, Buckets); it can equal the first.
func (s *Sketch) second(h uint64) uint64 { return ((h ^ h>>29) * secondMix >> 32) * s.nb >> 32 }

// homeOf is the key's home slot in its bucket, hash bits 15..13. Without
// TwoChoice a key claims its home slot when it is free, and otherwise the
// first claimable slot after it (cyclically), so nearly every key lives at
// home and refresh finds its word with one load that waits for no other:
// docs/DESIGN.md, Buckets.
func homeOf(h uint64) int { return int(h>>homeShift) & (slotsPerBucket - 1) }

const homeShift = 13

// fromHome is the first slot of mask m (bit k for slot k) counting
// cyclically from slot home: the order of claims and of ties between
// weakest slots without TwoChoice. m must not be 0.
func fromHome(m uint8, home int) int {
	return (bits.TrailingZeros8(bits.RotateLeft8(m, -home)) + home) & (slotsPerBucket - 1)
}

// tagFrom is the key's 16-bit fingerprint, hash bits 31..16. Tag 0 is read
// as 1, so that no key's tag matches an empty slot (the word 0).
func tagFrom(h uint64) uint16 { return max(uint16(h>>16), 1) }

// fresh re-reads the shared tick after a slot was seen "ahead" of now (apparent
// age >= 2^23): it was written at a tick this caller has not seen yet. Every
// stored epoch is <= the shared tick at the time of its write, so after the
// reload an apparent age is the slot's true age mod 2^24, and a slot still
// "ahead" is really 2^23 ticks old or more.
func (s *Sketch) fresh(now int64, w *[2 * slotsPerBucket]uint64, n int) int64 {
	e := epoch24(now)
	for i := 0; i < n; i++ {
		if w[i] != 0 && ageOf(w[i], e) >= aheadAge {
			return max(now, s.clk.hw.Load())
		}
	}
	return now
}

// observe is Observe (docs/DESIGN.md, Observe): scrub, refresh, claim, or
// challenge, adding weight wt (1 to countMax). Without TwoChoice it calls
// refresh itself, so the common case returns through one call less
// (docs/EXPERIMENTS.md, The home slot), and leaves the rest to observeBucket.
func (s *Sketch) observe(h uint64, now int64, wt uint32) (uint32, bool) {
	if traceOn {
		return s.observeTraced(h, now, wt)
	}
	if s.twoChoice {
		return s.observeView(h, now, wt, noLimit, 1)
	}
	i := s.first(h)
	b := &s.table[i]
	est, first, lost, miss := refresh(b, h, now, wt, countMax)
	if est != 0 {
		return est, first
	}
	return s.observeBucket(b, i, h, now, wt, lost, miss, noLimit, 1)
}

// observeBucket is observe for one bucket, the default, after refresh did
// not apply: lost and miss are what refresh returned. Branch-free passes
// over the bucket decide the common cases: retry if refresh's CAS on the
// key's one slot lost; on a miss, weakestOf, then a claim
// of the first free slot from the key's home or a challenge of the
// weakest. Everything else (a sibling to scrub, a duplicate, a slot ahead
// of now, any other lost CAS) goes to observe1, which makes the same
// decisions slowly. limit is noLimit for Observe; admit passes its own,
// which observe1 checks before a refresh, and never a lost CAS (retry adds
// unconditionally).
func (s *Sketch) observeBucket(b *bucket, shard, h uint64, now int64, wt uint32, lost int, miss bool, limit, sc uint32) (uint32, bool) {
	if lost != 0 {
		est, tried := retry(&b.s[lost-1], lost-1, uint64(tagFrom(h)), uint64(epoch24(now)), wt, now)
		switch tried {
		case 0:
			return est, false
		case maxAttempts:
			return s.dropped(shard, est, now, limit)
		}
		return s.observe1(b, shard, h, now, wt, tried, limit, sc)
	}
	if !miss {
		return s.observe1(b, shard, h, now, wt, 0, limit, sc)
	}
	tag := tagFrom(h)
	e := epoch24(now)
	home := homeOf(h)
	weakest, old := weakestOf(b, uint64(e), uint64(home), uint64(tag))
	if old {
		return s.observe1(b, shard, h, now, wt, 0, limit, sc) // a slot to scrub, one ahead of now, or the key's, claimed by a racer
	}
	weak, weakEff := (int(weakest)+home)&(slotsPerBucket-1), uint32(weakest>>3)
	x := b.s[weak].Load()
	if x != 0 && (tagOf(x) == tag || ageOf(x, e) >= evaporation || effective(x, e) != weakEff) {
		return s.observe1(b, shard, h, now, wt, 0, limit, sc) // a racing writer changed the slot
	}
	if weakEff == 0 { // Phase 2: claim.
		y := pack(tag, e, wt)
		ok := b.s[weak].CompareAndSwap(x, y)
		if traceOn {
			emit(traceEvent{Op: lab.Claim, Slot: weak, Old: x, New: y, OK: ok, Tick: now})
		}
		if !ok {
			return s.observe1(b, shard, h, now, wt, 1, limit, sc)
		}
		s.dedupe1(b, shard, weak, tag)
		return wt, true
	}
	// Phase 3: challenge the weakest.
	est, done, took := s.challengeSlot(&b.s[weak], weak, shard, h, x, e, weakEff, wt, limit, sc, tag, now)
	if !done {
		return s.observe1(b, shard, h, now, wt, 1, limit, sc)
	}
	if took {
		s.dedupe1(b, shard, weak, tag)
	}
	return est, true
}

// refresh is Phase 1 alone, the common case: the key holds exactly one slot,
// no slot is 24 or more ticks old or ahead of now, and one CAS wins. When
// the key's slot was written this tick already, the ages are not checked:
// that write scrubbed the bucket, and no slot turns 24 ticks old within a
// tick (docs/DESIGN.md, Scrub-on-write).
//
// The key's word is read from its home slot (homeOf), where nearly every
// key lives, so the estimate waits for that one load and not for a search.
// Beside it runs one test of all the other slots at once (SWAR over the
// packed tags, no loop and no branch per slot: bucket contents are random,
// and a branch that mispredicts when the load returns throws away the work
// the CPU had started on the next call), and a branch on it, then one on
// the home word's tag and epoch, tell the common cases apart: at home
// alone and written this tick (the new word is the old one plus wt), a
// miss, at home and first written this tick, or (for the mask and a second
// load) the key elsewhere. refresh was a frameless leaf before the home
// slot; it now has a 32-byte frame and calls matchMask only in that last
// case, and refreshSaturated only for a count that would pass countMax
// (docs/EXPERIMENTS.md, The home slot).
//
// top is the highest count a refresh may write: countMax for Observe; for
// admit, its limit (below countMax), so that a count that would pass the
// limit is refused, writing nothing, behind the same test that catches one
// passing countMax: a branch the CPU predicts.
//
// It returns the estimate (0 when it did not apply; for a refusal, the
// count that refused it marked overLimit, as observe1 answers), lost: the
// key's slot plus 1 when its CAS lost to another writer (retry takes it
// from there), and miss: the key holds no slot, so a claim or challenge
// may follow (weakestOf checks the ages).
func refresh(b *bucket, h uint64, now int64, wt, top uint32) (est uint32, first bool, lost int, miss bool) {
	tag := uint64(tagFrom(h)) // never 0, so an empty slot never matches
	e := uint64(epoch24(now))
	j := homeOf(h)
	x := b.s[j].Load()
	// Does another slot hold the tag? The 8 tags packed as 16-bit lanes
	// of two words, XORed with the tag in every lane so that a match is a
	// zero lane, with a bit set in the home slot's lane; a zero lane is
	// found by the borrow it leaves (v - 1 per lane, AND NOT v, the lanes'
	// high bits), exactly when there is one.
	const hi = 0xffff << 48
	t := tag * lane1s
	v0 := (b.s[0].Load()>>48 | b.s[1].Load()>>32&(hi>>32) | b.s[2].Load()>>16&(hi>>16) | b.s[3].Load()&hi) ^ t
	v1 := (b.s[4].Load()>>48 | b.s[5].Load()>>32&(hi>>32) | b.s[6].Load()>>16&(hi>>16) | b.s[7].Load()&hi) ^ t
	mark := uint64(1) << (16 * (j & 3))
	upper := -uint64(j >> 2)
	v0 |= mark &^ upper
	v1 |= mark & upper
	if ((v0-lane1s)&^v0|(v1-lane1s)&^v1)&laneHigh != 0 {
		// Another slot holds the tag: the key away from home, or a
		// duplicate. Search the mask.
		m := matchMask(b, tag)
		if m&(m-1) != 0 {
			return 0, false, 0, false // a duplicate: observe1 drains it
		}
		if m == 0 {
			return 0, false, 0, false // a racing writer changed the bucket
		}
		j = bits.TrailingZeros8(m)
		x = b.s[j].Load()
		if x>>tagShift != tag {
			return 0, false, 0, false // a racing writer changed the slot
		}
	} else if x>>epochShift == tag<<epochBits|e {
		// At home alone, and written this tick already (tag and epoch in
		// one compare): that write scrubbed the bucket, and no slot turns
		// 24 ticks old within a tick, so there is nothing to scrub
		// (docs/DESIGN.md, Scrub-on-write). The age is 0 and the tag and
		// epoch stay, so the new word is the old one plus wt: one add
		// between the load and the CAS. A count that would pass countMax
		// (it cannot carry into the epoch: both are below 2^24, and the
		// test catches it) is left to refreshSaturated, behind a branch the
		// CPU predicts, where a conditional move clamping every count made
		// each CAS wait for it.
		c := countOf(x) + wt
		if c > top {
			if top < countMax {
				return (c - wt) | overLimit, false, 0, false // admit's refusal: nothing written
			}
			return refreshSaturated(&b.s[j], j, x, tag, e, false, now)
		}
		return refreshCAS(&b.s[j], j, x, x+uint64(wt), c, false, now)
	} else if x>>tagShift != tag {
		return 0, false, 0, true // a miss: weakestOf checks the ages
	}
	// The key at home and first written this tick, or away from home.
	var c uint32
	var y uint64
	first = epochOf(x) != uint32(e)
	if !first {
		c = countOf(x) + wt // as above
		y = x + uint64(wt)
	} else {
		if anyOld(b, e) {
			return 0, false, 0, false
		}
		age := ageOf(x, uint32(e))    // no slot is old, so 0 < age < 24: never ahead
		c = countOf(x)>>(age&31) + wt // decay
		y = pack(uint16(tag), uint32(e), c)
	}
	if c > top {
		if top < countMax {
			return (c - wt) | overLimit, false, 0, false // admit's refusal: nothing written
		}
		return refreshSaturated(&b.s[j], j, x, tag, e, first, now)
	}
	return refreshCAS(&b.s[j], j, x, y, c, first, now)
}

// refreshCAS is refresh's last step: the CAS of the key's slot p (index j)
// from x to y, whose count is c.
func refreshCAS(p *atomic.Uint64, j int, x, y uint64, c uint32, first bool, now int64) (est uint32, fst bool, lost int, miss bool) {
	ok := p.CompareAndSwap(x, y)
	if traceOn {
		emit(traceEvent{Op: lab.Fast, Slot: j, Old: x, New: y, OK: ok, Tick: now})
	}
	if !ok {
		return 0, false, j + 1, false
	}
	return c, first, 0, false
}

// refreshSaturated is the end of refresh for a count that would pass
// countMax: the slot is written at countMax. It is its own function so that
// the compiler keeps refresh's test a branch, which the CPU predicts,
// instead of a conditional move that every estimate would wait on.
//
//go:noinline
func refreshSaturated(p *atomic.Uint64, j int, x, tag, e uint64, first bool, now int64) (est uint32, fst bool, lost int, miss bool) {
	return refreshCAS(p, j, x, pack(uint16(tag), uint32(e), countMax), countMax, first, now)
}

// retry is refresh after its CAS on the key's slot p (index j) lost to
// another writer, the common case when goroutines share a hot key. It first
// backs off, so the writer that won keeps the cache line and finishes its
// next calls at one core's speed instead of the two trading the line on
// every call. It does not read and classify the bucket again: a locked add
// of 0 reads the word back and takes its cache line for writing in one
// step, so the next CAS rarely loses; if the slot still holds the key,
// written this tick (so nothing to scrub: docs/DESIGN.md, Scrub-on-write),
// it adds to that word.
// It returns tried 0 and the estimate on success; maxAttempts and the
// estimate it read when every attempt lost (the update is dropped); else
// the attempts used, the lost CAS being the first of observe1's four, for
// observe1 to go on.
func retry(p *atomic.Uint64, j int, tag, e uint64, wt uint32, now int64) (est uint32, tried int) {
	for tried = 1; tried < maxAttempts; tried++ {
		backoff(tried)
		x := p.Add(0)
		if x>>tagShift != tag || x>>epochShift&epochMask != e {
			return 0, tried
		}
		est = countOf(x)
		c := satAdd(est, wt)
		y := pack(uint16(tag), uint32(e), c)
		ok := p.CompareAndSwap(x, y)
		if traceOn {
			emit(traceEvent{Op: lab.Fast, Slot: j, Old: x, New: y, OK: ok, Tick: now})
		}
		if ok {
			return c, 0
		}
	}
	return est, tried
}

// backoffRounds is the first wait after a lost refresh, in rounds of an
// empty loop: about 0.75 µs on the Intel host of BENCHMARKS.md. Each further
// lost CAS of the same call doubles it, so the wait is bounded (C4) and at
// most 7 times this.
const backoffRounds = 6144

// backoff waits before attempt tried (1 to 3) after a refresh's CAS on the
// key's slot lost (retry, and observeView with TwoChoice). It touches no
// memory, schedules nothing and needs no instruction a platform lacks: an
// empty counting loop, which the Go compiler keeps (a DECQ/JGT pair in
// retry's assembly on amd64).
func backoff(tried int) {
	for i := backoffRounds << (tried - 1); i > 0; i-- {
	}
}

// lane1s and laneHigh are the lowest and the highest bit of each 16-bit
// lane of a word: refresh's test for a tag in another slot (a zero lane).
const (
	lane1s   = 0x0001_0001_0001_0001
	laneHigh = 0x8000_8000_8000_8000
)

// matchMask has bit k set when slot k of b holds tag: eight independent
// compares joined as a tree, with no loop, no branches, and a dependency
// chain three ORs long.
func matchMask(b *bucket, tag uint64) uint8 {
	return (b2u(b.s[0].Load()>>tagShift == tag) | b2u(b.s[1].Load()>>tagShift == tag)<<1 |
		(b2u(b.s[2].Load()>>tagShift == tag)<<2 | b2u(b.s[3].Load()>>tagShift == tag)<<3)) |
		((b2u(b.s[4].Load()>>tagShift == tag)<<4 | b2u(b.s[5].Load()>>tagShift == tag)<<5) |
			(b2u(b.s[6].Load()>>tagShift == tag)<<6 | b2u(b.s[7].Load()>>tagShift == tag)<<7))
}

// b2u is 1 for true and 0 for false, as one SETcc.
func b2u(c bool) uint8 {
	var u uint8
	if c {
		u = 1
	}
	return u
}

// ageCarry finds old slots without a compare each: an age (below 2^24) of
// 24 or more, plus ageCarry, carries into bit 24, so ORing age+ageCarry
// over the slots and testing bit 24 says whether any is 24 or more.
const ageCarry = 1<<epochBits - evaporation

// anyOld says whether a slot of b is 24 or more ticks old (to scrub) or
// ahead of e, with the ages folded by ageCarry: no branch per slot.
func anyOld(b *bucket, e uint64) bool {
	var ages uint64
	for k := range slotsPerBucket {
		ages |= slotAge(b.s[k].Load(), e) + ageCarry
	}
	return ages>>epochBits != 0
}

// slotAge is the apparent age of word y at epoch e, as refresh and
// weakestOf read it: an empty slot is never old (age 0), and a slot ahead of
// e reads 2^23 or more.
func slotAge(y, e uint64) uint64 {
	t := y >> epochShift
	if y == 0 {
		t = e
	}
	return (e - t) & epochMask
}

// weakestOf is the second pass of a miss, over words still in L1: the
// smallest effective count at epoch e times 8 plus its slot's distance
// from slot home (cyclically: the first from home among equals), where an
// empty slot reads 0, so a result below 8 is the first free slot from
// home; and old, whether a slot is 24 or more ticks old (to
// scrub) or ahead of e, or holds tag, which the caller leaves to
// observe1. Like refresh, it has no branches on the slots' contents.
// Without old the counts are exact unless a racing writer changed the
// bucket since; the caller reloads the one word it acts on and checks it
// still reads as here.
//
// The tag test closes a race of a new key's first writers: refresh read
// a miss, then a racer claimed a slot for the same key before this pass
// read the bucket again. This pass then sees that slot as an occupied one
// and, without the test, would claim (or challenge for) another, leaving
// the key two slots whose counts each pass a limit that their sum passes
// (docs/DESIGN.md, Observe: one slot per key). Seen here, the key is
// refreshed by observe1 instead. A racer's claim made after this pass is
// of the slot this caller chose too, when the tick and the other slots stand
// still, and one of the two compare-and-swaps loses.
func weakestOf(b *bucket, e, home, tag uint64) (weakest uint64, old bool) {
	const last = slotsPerBucket - 1
	// Two accumulators, even and odd slots, halve the chain of minimums.
	w0, a0 := weakKey(b.s[0].Load(), e, -home&last, tag)
	w1, a1 := weakKey(b.s[1].Load(), e, (1-home)&last, tag)
	a0, a1 = a0+ageCarry, a1+ageCarry
	for k := uint64(2); k+1 < slotsPerBucket; k += 2 {
		c0, x0 := weakKey(b.s[k].Load(), e, (k-home)&last, tag)
		c1, x1 := weakKey(b.s[k+1].Load(), e, (k+1-home)&last, tag)
		w0, w1 = min(w0, c0), min(w1, c1)
		a0, a1 = a0|(x0+ageCarry), a1|(x1+ageCarry)
	}
	return min(w0, w1), (a0|a1)>>epochBits != 0
}

// weakKey is weakestOf's view of word y at epoch e, in the slot d places
// after home: its effective count times 8 plus d, and its age as slotAge
// reads it, or with bits 0 to 24 set when y holds tag (which reads as
// old). The tag test is arithmetic, not a branch: y's tag XOR tag is below
// 2^16, and 0 (a match) alone turns to 2^64-1 when 1 is taken from it.
func weakKey(y, e, d, tag uint64) (key, age uint64) {
	age = slotAge(y, e) | ((y>>tagShift^tag)-1)>>(63-epochBits)
	return (y&countMax)>>(age&63)<<3 | d, age
}

// observe1 is observe for one bucket, the slow path, after
// observeBucket's one pass did not decide: a sibling to scrub, a duplicate,
// a slot ahead of now, or a lost CAS (attempt says how many were used). It
// makes the same decisions as observeView.
func (s *Sketch) observe1(b *bucket, shard, h uint64, now int64, wt uint32, attempt int, limit, sc uint32) (uint32, bool) {
	tag := uint64(tagFrom(h))
	var readEst uint32 = 1
	reloaded := false
	for attempt < maxAttempts {
		e := uint64(epoch24(now))
		e32 := uint32(e)
		var w [slotsPerBucket]uint64
		var zero, match, stale, ahead uint
		for i := range w {
			x := b.s[i].Load()
			w[i] = x
			switch {
			case x == 0:
				zero |= 1 << i
			case x>>tagShift == tag:
				match |= 1 << i
				if (e-x>>epochShift)&epochMask >= aheadAge {
					ahead |= 1 << i
				}
			default:
				if age := (e - x>>epochShift) & epochMask; age >= evaporation {
					stale |= 1 << i
					if age >= aheadAge {
						ahead |= 1 << i
					}
				}
			}
		}
		other := ^(zero | match) & (1<<slotsPerBucket - 1)
		if ahead != 0 && !reloaded {
			// A slot written at a tick this caller has not seen: reload the
			// shared tick once and look again (see fresh).
			now, reloaded = max(now, s.clk.hw.Load()), true
			if traceOn {
				emit(traceEvent{Op: lab.Reload, Slot: bits.TrailingZeros(ahead), Tick: now})
			}
			continue
		}
		attempt++
		for m := stale & other; m != 0; m &= m - 1 {
			// Scrub-on-write (docs/DESIGN.md). A failed CAS means a writer got there
			// first; the slot is still treated as claimable below, and a
			// claim that expects the old word then fails and retries.
			i := bits.TrailingZeros(m)
			ok := b.s[i].CompareAndSwap(w[i], 0)
			if traceOn {
				emit(traceEvent{Op: lab.Scrub, Slot: i, Old: w[i], OK: ok, Tick: now})
			}
			if ok {
				s.stats.add(shard, statScrubbed)
				w[i] = 0
			}
		}
		if match != 0 { // Phase 1: refresh.
			i := bits.TrailingZeros(match)
			x := w[i]
			age := ageOf(x, e32)
			eff := decay(countOf(x), age)
			readEst = eff
			if eff+wt > limit {
				return eff | overLimit, false // admit: refused, nothing written
			}
			n := satAdd(eff, wt)
			y := pack(uint16(tag), e32, n)
			ok := b.s[i].CompareAndSwap(x, y)
			if traceOn {
				emit(traceEvent{Op: lab.Refresh, Slot: i, Old: x, New: y, OK: ok, Tick: now})
			}
			if ok {
				if dup := match & (match - 1); dup != 0 {
					s.drainIn(b, shard, bits.TrailingZeros(dup), i, uint16(tag))
				}
				return n, age > 0
			}
			continue
		}
		// The miss path: the first claimable slot from the key's home,
		// else the weakest (the first from home among equals).
		free := zero | stale&other
		home := homeOf(h)
		weak, weakEff := -1, uint32(math.MaxUint32)
		for m := bits.RotateLeft8(uint8(other&^stale), -home); m != 0; m &= m - 1 {
			i := (bits.TrailingZeros8(m) + home) & (slotsPerBucket - 1)
			eff := effective(w[i], e32)
			if eff == 0 {
				free |= 1 << i
			} else if eff < weakEff {
				weak, weakEff = i, eff
			}
		}
		if free != 0 { // Phase 2: claim.
			i := fromHome(uint8(free), home)
			y := pack(uint16(tag), e32, wt)
			ok := b.s[i].CompareAndSwap(w[i], y)
			if traceOn {
				emit(traceEvent{Op: lab.Claim, Slot: i, Old: w[i], New: y, OK: ok, Tick: now})
			}
			if ok {
				s.dedupe1(b, shard, i, uint16(tag))
				return wt, true
			}
			continue
		}
		// Phase 3: challenge the weakest, one draw per unit of weight.
		if est, done, took := s.challengeSlot(&b.s[weak], weak, shard, h, w[weak], e32, weakEff, wt, limit, sc, uint16(tag), now); done {
			if took {
				s.dedupe1(b, shard, weak, uint16(tag))
			}
			return est, true
		}
	}
	return s.dropped(shard, readEst, now, limit)
}

// dropped ends a call whose every attempt lost its CAS (docs/DESIGN.md,
// Dropped updates): the increment is dropped and counted, and the call
// returns the estimate it read, est, with the flag true; for admit (a limit
// other than noLimit) it is a refusal, marked overLimit.
func (s *Sketch) dropped(shard uint64, est uint32, now int64, limit uint32) (uint32, bool) {
	if traceOn {
		emit(traceEvent{Op: lab.Exhausted, Slot: -1, Tick: now})
	}
	s.stats.add(shard, statCAS)
	if limit != noLimit {
		s.stats.add(shard, statContended)
		est |= overLimit
	}
	return est, true
}

// dedupe1 is dedupe on one bucket, with the match mask in place of the
// loop: the first other slot holding tag, if any, is folded in slot order.
func (s *Sketch) dedupe1(b *bucket, shard uint64, i int, tag uint16) {
	if m := matchMask(b, uint64(tag)) &^ (1 << i); m != 0 {
		j := bits.TrailingZeros8(m)
		s.drainIn(b, shard, max(i, j), min(i, j), tag)
	}
}

// drainIn is drain on one bucket.
func (s *Sketch) drainIn(b *bucket, shard uint64, from, into int, tag uint16) {
	v := view{b: [2]*bucket{b}, n: slotsPerBucket, shard: shard}
	s.drain(&v, from, into, tag)
}

// challengeSlot is Phase 3, shared by observe1 and observeView: key h (tag)
// challenges the weakest slot p (index weak, word x, reading weakEff at epoch
// e) with one lottery draw per unit of wt. done is false when a CAS was lost
// and the caller should look again; took says the key now holds the slot, so
// the caller folds in any racing duplicate. The estimate is wt when the key
// stays untracked (first-sighting treatment, docs/DESIGN.md, The lottery).
//
// limit is noLimit for Observe. For admit, a weakest key at its limit (its
// count at least half the limit: at the limit within the last tick) means
// the bucket is full of keys at their limit, and the sketch's overflow
// policy decides (admit.Overflow): overflowRefuse refuses the new key,
// writing nothing and drawing nothing, so that no key at its limit loses
// counts to it; overflowShare does so three times in four (two bits of a
// fresh salt), else goes on as overflowAdmit, the lottery.
func (s *Sketch) challengeSlot(p *atomic.Uint64, weak int, shard, h, x uint64, e, weakEff, wt, limit, sc uint32, tag uint16, now int64) (est uint32, done, took bool) {
	full := limit != noLimit && 2*uint64(weakEff) >= uint64(limit)
	if sc != 1 && limit != noLimit && limit < 4*sc {
		// A smooth sketch's limit of 3 (package rate's Burst of 1) admits
		// a key again once it reads 1, not half of 3: at its limit while
		// it reads 1 or more.
		full = 2*uint64(weakEff) >= 2*uint64(limit)-4*uint64(sc)
	}
	if full && s.overflow != overflowAdmit && (s.overflow == overflowRefuse || s.salt()&3 != 0) {
		s.stats.add(shard, statRefusedNew)
		return weakEff | overLimit | pressure, true, false
	}
	// The draws run in external counts (sc of the table's each): one per
	// unit of weight, each chipping one count, as in a classic sketch.
	effX, wtX := weakEff, wt
	if sc != 1 {
		effX, wtX = scaleDown(weakEff, sc), scaleDown(wt-sc+1, sc) // wt is a multiple of sc
	}
	wins, used := s.challenge(h, x, ageOf(x, e), effX, wtX, sc)
	if wins == 0 {
		if traceOn {
			emit(traceEvent{Op: lab.Bounce, Slot: weak, Old: x, Tick: now})
		}
		s.stats.add(shard, statLost)
		return s.untracked(shard, wt, limit), true, false
	}
	if wins == effX {
		// The win that empties the slot claims it, with the units left.
		c := (wtX - used + 1) * sc
		y := pack(tag, e, c)
		ok := p.CompareAndSwap(x, y)
		if traceOn {
			emit(traceEvent{Op: lab.Takeover, Slot: weak, Old: x, New: y, OK: ok, Tick: now})
		}
		if ok {
			s.stats.add(shard, statEvictions)
			if full {
				s.stats.add(shard, statEvictedAtLimit)
			}
			return c, true, true
		}
		return 0, false, false
	}
	// count - wins·2^age reads exactly wins lower at this age and keeps the
	// victim's epoch, so its first-sighting flag is untouched.
	if y := x - uint64(wins*sc)<<ageOf(x, e); s.casChip(p.CompareAndSwap(x, y), weak, x, y, now) {
		s.stats.addN(shard, statChips, wins)
		s.stats.add(shard, statLost)
		if full {
			s.stats.add(shard, statChippedAtLimit)
		}
		return s.untracked(shard, wt, limit), true, false
	}
	return 0, false, false
}

// untracked is the estimate of a key that stays untracked after its
// challenge, wt (first-sighting treatment), counted for admit.
func (s *Sketch) untracked(shard uint64, wt, limit uint32) uint32 {
	if limit == noLimit {
		return wt
	}
	s.stats.add(shard, statUntracked)
	return wt
}

// observeView is observe over a view of one or two buckets (TwoChoice). With
// a limit (admit) it leaves out refreshView, which adds unconditionally.
func (s *Sketch) observeView(h uint64, now int64, wt, limit, sc uint32) (uint32, bool) {
	v := s.viewOf(h)
	tag := tagFrom(h)
	var attempt int
	if limit == noLimit {
		var est uint32
		var first bool
		if est, first, attempt = refreshView(&v, uint64(tag), uint64(epoch24(now)), wt, now); est != 0 {
			return est, first
		}
	}
	if attempt > 0 {
		backoff(attempt) // its CAS lost: as in retry, the writer that won keeps the line
	}
	var readEst uint32 = 1 // what a call that exhausts its retries returns
	var w [2 * slotsPerBucket]uint64
	for ; attempt < maxAttempts; attempt++ {
		v.load(&w)
		now = s.fresh(now, &w, v.n)
		e := epoch24(now)

		// One pass over the slots in registers: scrub the ancient,
		// find the key, the first claimable slot per bucket, and the weakest.
		match, dup := -1, -1
		free := [2]int{-1, -1}
		var live [2]int
		weak, weakEff := -1, uint32(math.MaxUint32)
		for i := 0; i < v.n; i++ {
			x := w[i]
			if x != 0 && tagOf(x) == tag {
				if match < 0 {
					match = i
				} else if dup < 0 {
					dup = i
				}
				continue
			}
			if x != 0 {
				age := ageOf(x, e)
				if age >= evaporation {
					// Zero it before it can wrap back to a small age and
					// resurrect. A failed CAS means a writer got there first.
					ok := v.at(i).CompareAndSwap(x, 0)
					if traceOn {
						emit(traceEvent{Op: lab.Scrub, Slot: i, Old: x, OK: ok, Tick: now})
					}
					if ok {
						s.stats.add(v.shard, statScrubbed)
						w[i], x = 0, 0
					}
				} else if eff := decay(countOf(x), age); eff > 0 {
					live[i>>3]++
					if eff < weakEff {
						weak, weakEff = i, eff
					}
					continue
				}
			}
			// Empty or dead: claimable. The first one in slot order, so that
			// racing claimers of one key pick the same slot.
			if free[i>>3] < 0 {
				free[i>>3] = i
			}
		}

		switch {
		case match >= 0: // Phase 1: refresh.
			x := w[match]
			age := ageOf(x, e)
			eff := decay(countOf(x), age)
			readEst = eff
			if eff+wt > limit {
				return eff | overLimit, false // admit: refused, nothing written
			}
			n := satAdd(eff, wt)
			y := pack(tag, e, n)
			ok := v.at(match).CompareAndSwap(x, y)
			if traceOn {
				emit(traceEvent{Op: lab.Refresh, Slot: match, Old: x, New: y, OK: ok, Tick: now})
			}
			if ok {
				if dup >= 0 {
					s.drain(&v, dup, match, tag)
				}
				return n, age > 0
			}
			if attempt+1 < maxAttempts {
				backoff(attempt + 1)
			}

		case free[0] >= 0 || free[1] >= 0: // Phase 2: claim.
			i := free[0]
			if i < 0 || (free[1] >= 0 && live[1] < live[0]) {
				i = free[1]
			}
			y := pack(tag, e, wt)
			ok := v.at(i).CompareAndSwap(w[i], y)
			if traceOn {
				emit(traceEvent{Op: lab.Claim, Slot: i, Old: w[i], New: y, OK: ok, Tick: now})
			}
			if ok {
				s.dedupe(&v, i, tag)
				return wt, true
			}

		default: // Phase 3: challenge the weakest, one draw per unit of weight.
			if est, done, took := s.challengeSlot(v.at(weak), weak, v.shard, h, w[weak], e, weakEff, wt, limit, sc, tag, now); done {
				if took {
					s.dedupe(&v, weak, tag)
				}
				return est, true
			}
		}
	}
	if traceOn {
		emit(traceEvent{Op: lab.Exhausted, Slot: -1, Tick: now})
	}
	s.stats.add(v.shard, statCAS)
	if limit != noLimit {
		s.stats.add(v.shard, statContended)
		readEst |= overLimit
	}
	return readEst, true
}

// refreshView is observeView's Phase 1 alone, for the common case, with
// the match masks of the view's buckets instead of its loop: the key holds
// exactly one slot, no slot of the view is 24 or more ticks old or ahead of
// now (every age is checked: with TwoChoice a write always scrubs), and one
// CAS wins. It returns the estimate, or 0 and the attempts used (1 when its
// CAS lost) for observeView's loop to go on.
func refreshView(v *view, tag, e uint64, wt uint32, now int64) (est uint32, first bool, tried int) {
	m := uint(matchMask(v.b[0], tag))
	if v.n > slotsPerBucket {
		m |= uint(matchMask(v.b[1], tag)) << slotsPerBucket
	}
	if m == 0 || m&(m-1) != 0 {
		return 0, false, 0 // a miss or a duplicate
	}
	old := anyOld(v.b[0], e) || v.n > slotsPerBucket && anyOld(v.b[1], e)
	j := bits.TrailingZeros(m)
	x := v.at(j).Load()
	age := ageOf(x, uint32(e))
	if old || x>>tagShift != tag || age >= evaporation {
		return 0, false, 0 // a slot to scrub or ahead of now, or a racing writer
	}
	c := satAdd(countOf(x)>>(age&31), wt) // decay, for an age below 24
	y := pack(uint16(tag), uint32(e), c)
	ok := v.at(j).CompareAndSwap(x, y)
	if traceOn {
		emit(traceEvent{Op: lab.Fast, Slot: j, Old: x, New: y, OK: ok, Tick: now})
	}
	if !ok {
		return 0, false, 1
	}
	return c, age > 0, 0
}

// dedupe runs after a claim at slot i. Racing claimers of one new key agree on
// the slot while the tick stands still, but across a tick boundary (or across
// the two buckets of TwoChoice) two of them can claim different slots. The
// later claim always sees the earlier one here, and folds the later slot in
// slot order into the earlier, which readers use.
func (s *Sketch) dedupe(v *view, i int, tag uint16) {
	for j := 0; j < v.n; j++ {
		if j == i {
			continue
		}
		if x := v.at(j).Load(); x != 0 && tagOf(x) == tag {
			s.drain(v, max(i, j), min(i, j), tag)
			return
		}
	}
}

// drain moves the count of duplicate slot from into slot into (both holding
// tag), leaving from empty. Counts whose target was evicted meanwhile are
// lost, like any evicted count; a merge that loses its CAS race 4 times is
// dropped and counted like a dropped increment.
func (s *Sketch) drain(v *view, from, into int, tag uint16) {
	for range maxAttempts {
		x := v.at(from).Load()
		if x == 0 || tagOf(x) != tag {
			return
		}
		ok := v.at(from).CompareAndSwap(x, 0)
		if traceOn {
			emit(traceEvent{Op: lab.Drain, Slot: from, Old: x, OK: ok, Est: uint32(into)})
		}
		if ok {
			s.merge(v, into, tag, x)
			return
		}
	}
}

func (s *Sketch) merge(v *view, into int, tag uint16, x uint64) {
	for range maxAttempts {
		e := epoch24(s.clk.hw.Load())
		y := v.at(into).Load()
		if y == 0 || tagOf(y) != tag {
			return
		}
		n := min(effective(y, e)+effective(x, e), countMax)
		if n == 0 || v.at(into).CompareAndSwap(y, pack(tag, e, n)) {
			return
		}
	}
	s.stats.add(v.shard, statCAS)
}

// estimate is the read path: the first slot holding the key's tag, decayed.
// With one bucket per key it reads the key's home slot, as refresh does,
// beside matchMask, and the mask's first slot when that is not home. A word
// written this tick reads its count as it is, decided by one compare of tag
// and epoch, so the answer does not wait for the decay's shift.
func (s *Sketch) estimate(h uint64, now int64) uint32 {
	tag := tagFrom(h)
	if !s.twoChoice {
		b := &s.table[s.first(h)]
		j := homeOf(h)
		x := b.s[j].Load()
		m := uint(matchMask(b, uint64(tag)))
		if m == 0 {
			return 0
		}
		if m&(2<<j-1) != 1<<j { // home is not the first slot holding the tag
			x = b.s[bits.TrailingZeros(m)].Load()
		}
		if x>>epochShift == uint64(tag)<<epochBits|uint64(epoch24(now)) {
			return countOf(x) // written this tick: age 0
		}
		if tagOf(x) == tag {
			return s.read(x, now)
		}
		// A racing writer changed the slot: look again, slot by slot.
	}
	v := s.viewOf(h)
	for i := 0; i < v.n; i++ {
		if x := v.at(i).Load(); x != 0 && tagOf(x) == tag {
			return s.read(x, now)
		}
	}
	return 0
}

// read is word x's decayed count at tick now, for the read path: a slot
// written at a tick this caller has not seen yet is read at the shared tick.
func (s *Sketch) read(x uint64, now int64) uint32 {
	age := ageOf(x, epoch24(now))
	if age >= aheadAge {
		age = ageOf(x, epoch24(max(now, s.clk.hw.Load())))
	}
	return decay(countOf(x), age)
}

// locate returns where key lives: its bucket, its second candidate bucket
// with TwoChoice (else -1), and its fingerprint (internal/lab).
func (s *Sketch) locate(key string) (bucket, second int, tag uint16) {
	h := s.h.str(key)
	v := s.viewOf(h)
	second = -1
	if v.n > slotsPerBucket {
		second = int(s.second(h))
	}
	return int(v.shard), second, tagFrom(h)
}

// slots returns the 8 slot words of bucket i, each read atomically
// (internal/lab).
func (s *Sketch) slots(i int) [slotsPerBucket]uint64 {
	var w [slotsPerBucket]uint64
	for j := range w {
		w[j] = s.table[i].s[j].Load()
	}
	return w
}

// The tools of this module that show what a sketch holds, and the
// experiments that run the retired chip lottery, reach it through
// internal/lab, outside the library's API.
func init() {
	lab.Register(
		func(sk any, key string) (int, int, uint16) { return sk.(*Sketch).locate(key) },
		func(sk any, i int) [8]uint64 { return sk.(*Sketch).slots(i) },
		func(w uint64, now int64) uint32 { return effective(w, epoch24(now)) },
		func(sk any) { sk.(*Sketch).lottery = lotteryChip },
	)
}

// casChip passes a chip's CAS result through, reporting it in trace builds.
func (s *Sketch) casChip(ok bool, slot int, old, new uint64, now int64) bool {
	if traceOn {
		emit(traceEvent{Op: lab.Chip, Slot: slot, Old: old, New: new, OK: ok, Tick: now})
	}
	return ok
}
