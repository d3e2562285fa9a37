package epochsketch

import (
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// TopK keeps the k keys with the largest recent estimates: the companion
// that names a Sketch's heavy hitters, since the sketch itself stores
// fingerprints, not keys. Memory is fixed by k (k entries and their key
// strings).
//
// A TopK bound to a sketch (NewTopKFor) decays with it: each entry holds an
// estimate and the sketch's tick when it was taken, and reads as
// estimate >> (ticks since), as the sketch reads its counts. So a key that
// went quiet sinks and leaves, the floor a newcomer must beat falls with
// time, and List reports current, decayed estimates. Its Observe observes
// the sketch and offers the result in one call, with the sketch's own tick.
// A TopK from NewTopK has no clock: its entries never decay.
//
// An estimate no larger than the decayed minimum of a full TopK costs two
// atomic loads and changes nothing. Above it, offers are sampled by value: an
// estimate is taken when it reaches a new multiple of a step between e/32 and
// e/16 (every value below 32), so a heavy key, which is most of the traffic,
// takes the lock for one arrival in 16 to 32. Observe and ObserveN sample by
// the step their weight crosses, so weighted keys enter as readily as
// others; Offer, which does not know the weight, takes multiples of the step.
// An entry may lag its key's estimate by up to 1/16, and a key crossing the
// minimum may enter that much late.
//
// The zero TopK is not usable: create one with NewTopK or NewTopKFor. A TopK
// is safe for concurrent use and must not be copied.
type TopK struct {
	_  noCopy
	sk *Sketch // the clock of the entries; nil: they never decay
	// The smallest entry of a full TopK (count 0 until full). The tick is
	// written before the count, and the count zeroed before the tick
	// changes, so a reader that loads the tick first never sees a floor
	// higher than the true one.
	floorTick  atomic.Int64
	floorCount atomic.Uint32

	mu    sync.Mutex
	k     int
	heap  []topEntry // min-heap by decayed estimate
	index map[string]int
}

// TopEntry is one key of a TopK and its estimate.
type TopEntry struct {
	Key      string
	Estimate uint32
}

// topEntry is an entry as held: the estimate and the tick it was taken at.
type topEntry struct {
	key   string
	count uint32
	tick  int64
}

// at is e's estimate decayed to tick now (>= e.tick).
func (e *topEntry) at(now int64) uint32 { return decayed(e.count, now-e.tick) }

// decayed is count >> age, 0 from an age of 32 on.
func decayed(count uint32, age int64) uint32 {
	if age <= 0 {
		return count
	}
	if age >= 32 {
		return 0
	}
	return count >> age
}

// NewTopK returns a TopK of k keys whose entries never decay. It panics if
// k < 1.
func NewTopK(k int) *TopK {
	if k < 1 {
		panic("epochsketch: NewTopK needs k >= 1")
	}
	return &TopK{k: k, heap: make([]topEntry, 0, k), index: make(map[string]int, k)}
}

// NewTopKFor returns a TopK of k keys bound to s: its entries decay with s's
// ticks, and its Observe methods observe s. It panics if k < 1 or s is nil.
func NewTopKFor(s *Sketch, k int) *TopK {
	if s == nil {
		panic("epochsketch: NewTopKFor needs a Sketch")
	}
	tk := NewTopK(k)
	tk.sk = s
	return tk
}

// Observe observes key in the bound sketch and offers the estimate: one call
// for Sketch.Observe and Offer. It panics on a TopK from NewTopK.
func (tk *TopK) Observe(key string) (estimate uint32, first bool) {
	s := tk.bound()
	now := s.now()
	estimate, first = s.observe(s.h.str(key), now, 1)
	if !skipCrossing(estimate, 1, tk.floorAt(now)) {
		tk.offer(key, nil, estimate, now)
	}
	return estimate, first
}

// ObserveBytes is Observe for a key held in a byte slice; the key is copied
// only when it enters.
func (tk *TopK) ObserveBytes(key []byte) (estimate uint32, first bool) {
	s := tk.bound()
	now := s.now()
	estimate, first = s.observe(s.h.bytes(key), now, 1)
	if !skipCrossing(estimate, 1, tk.floorAt(now)) {
		tk.offer("", key, estimate, now)
	}
	return estimate, first
}

// ObserveN is the explicit form of Observe, as Sketch.ObserveN is of
// Sketch.Observe: n occurrences of key at time t (the zero t means the
// sketch's clock), then the offer. n == 0 records and offers nothing.
func (tk *TopK) ObserveN(t time.Time, key string, n uint32) (estimate uint32, first bool) {
	return tk.observeN(t, key, nil, n)
}

// ObserveBytesN is ObserveN for a key held in a byte slice; the key is copied
// only when it enters.
func (tk *TopK) ObserveBytesN(t time.Time, key []byte, n uint32) (estimate uint32, first bool) {
	return tk.observeN(t, "", key, n)
}

// observeN observes key (the string, or b when b is not nil) n times at t.
func (tk *TopK) observeN(t time.Time, key string, b []byte, n uint32) (uint32, bool) {
	s := tk.bound()
	h := s.h.str(key)
	if b != nil {
		h = s.h.bytes(b)
	}
	if n == 0 {
		return s.observeN(t, h, 0)
	}
	now := s.writeAt(t)
	estimate, first := s.observe(h, now, min(n, countMax))
	if !skipCrossing(estimate, n, tk.floorAt(now)) {
		tk.offer(key, b, estimate, now)
	}
	return estimate, first
}

func (tk *TopK) bound() *Sketch {
	if tk.sk == nil {
		panic("epochsketch: TopK.Observe needs a TopK bound to a sketch (NewTopKFor)")
	}
	return tk.sk
}

// now is the bound sketch's current tick for reading, or 0.
func (tk *TopK) now() int64 {
	if tk.sk == nil {
		return 0
	}
	return tk.sk.peekNow()
}

// Offer records key's latest estimate, as of the bound sketch's current
// tick (a TopK from NewTopK has no ticks).
func (tk *TopK) Offer(key string, estimate uint32) {
	now := tk.now()
	if skip(estimate, tk.floorAt(now)) {
		return
	}
	tk.offer(key, nil, estimate, now)
}

// OfferBytes is Offer for a key in a byte slice; the key is copied only when
// it enters.
func (tk *TopK) OfferBytes(key []byte, estimate uint32) {
	now := tk.now()
	if skip(estimate, tk.floorAt(now)) {
		return
	}
	tk.offer("", key, estimate, now)
}

// floorAt is the smallest entry's estimate decayed to tick now, or 0 if the
// TopK is not full.
func (tk *TopK) floorAt(now int64) uint32 {
	tick := tk.floorTick.Load()
	return decayed(tk.floorCount.Load(), now-tick)
}

// skip reports whether an offer can be dropped without taking the lock: it
// is not above the floor, or it is not a multiple of its sampling step
// (2^(bits(e)-5), between e/32 and e/16).
func skip(estimate, floor uint32) bool {
	return skipCrossing(estimate, 1, floor)
}

// skipCrossing is skip for an estimate that grew by weight: it is taken when
// the growth reached a new multiple of the step, whatever the weight.
func skipCrossing(estimate, weight, floor uint32) bool {
	if estimate <= floor {
		return true
	}
	n := bits.Len32(estimate)
	if n <= 5 {
		return false
	}
	s := uint(n - 5)
	return weight < estimate && estimate>>s == (estimate-weight)>>s
}

// offer takes the lock and records (key or bkey) at estimate, tick now.
func (tk *TopK) offer(key string, bkey []byte, estimate uint32, now int64) {
	tk.mu.Lock()
	if bkey != nil {
		if i, ok := tk.index[string(bkey)]; ok { // a map lookup by string(b) does not allocate
			tk.update(i, estimate, now)
		} else {
			tk.insert(string(bkey), estimate, now)
		}
	} else if i, ok := tk.index[key]; ok {
		tk.update(i, estimate, now)
	} else {
		tk.insert(key, estimate, now)
	}
	tk.mu.Unlock()
}

func (tk *TopK) update(i int, estimate uint32, now int64) {
	e := &tk.heap[i]
	if now < e.tick { // a late offer: read it at the entry's tick
		estimate, now = decayed(estimate, e.tick-now), e.tick
	}
	e.count, e.tick = estimate, now
	tk.up(i)
	tk.down(i)
	tk.setFloor()
}

func (tk *TopK) insert(key string, estimate uint32, now int64) {
	e := topEntry{key, estimate, now}
	switch {
	case len(tk.heap) < tk.k:
		tk.heap = append(tk.heap, e)
		tk.index[key] = len(tk.heap) - 1
		tk.up(len(tk.heap) - 1)
	case lessEntry(&tk.heap[0], &e):
		delete(tk.index, tk.heap[0].key)
		tk.heap[0] = e
		tk.index[key] = 0
		tk.down(0)
	}
	tk.setFloor()
}

// setFloor publishes the smallest entry once the TopK is full: below it,
// decayed to the offer's tick, an offer cannot change anything.
func (tk *TopK) setFloor() {
	if len(tk.heap) == tk.k {
		m := &tk.heap[0]
		tk.floorCount.Store(0)
		tk.floorTick.Store(m.tick)
		tk.floorCount.Store(m.count)
	}
}

// List returns the entries with their estimates decayed to now, largest
// first (ties by key); entries that decayed to 0 are left out. Each is the
// estimate its key was last sampled at (see TopK), decayed: it may lag the
// key's by up to 1/16. For the current estimates, read each listed key
// again with the bound sketch's Estimate, as `epochsketch top` does.
func (tk *TopK) List() []TopEntry {
	now := tk.now()
	tk.mu.Lock()
	out := make([]TopEntry, 0, len(tk.heap))
	for i := range tk.heap {
		if v := tk.heap[i].at(max(now, tk.heap[i].tick)); v > 0 {
			out = append(out, TopEntry{tk.heap[i].key, v})
		}
	}
	tk.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Estimate != out[j].Estimate {
			return out[i].Estimate > out[j].Estimate
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// Len returns the number of entries (at most k).
func (tk *TopK) Len() int {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	return len(tk.heap)
}

// lessEntry orders entries by their estimates decayed to the later of their
// ticks. Decay keeps that order (a >> d <= b >> d when a <= b), so the heap
// stays valid as time passes.
func lessEntry(a, b *topEntry) bool {
	now := max(a.tick, b.tick)
	return a.at(now) < b.at(now)
}

func (tk *TopK) less(i, j int) bool { return lessEntry(&tk.heap[i], &tk.heap[j]) }

func (tk *TopK) swap(i, j int) {
	tk.heap[i], tk.heap[j] = tk.heap[j], tk.heap[i]
	tk.index[tk.heap[i].key] = i
	tk.index[tk.heap[j].key] = j
}

func (tk *TopK) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !tk.less(i, p) {
			return
		}
		tk.swap(i, p)
		i = p
	}
}

func (tk *TopK) down(i int) {
	n := len(tk.heap)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && tk.less(c+1, c) {
			c++
		}
		if !tk.less(c, i) {
			return
		}
		tk.swap(i, c)
		i = c
	}
}
