package epochsketch

import (
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
)

// TopK keeps the k keys with the largest estimates offered to it: the
// companion that names a Sketch's heavy hitters, since the sketch itself
// stores fingerprints, not keys. Memory is fixed by k (k entries and their
// key strings).
//
// Feed it Observe's estimate. An estimate no larger than the current minimum
// of a full TopK costs one atomic load and changes nothing. Above it, offers
// are sampled by value: an estimate e is taken when it is a multiple of a step
// between e/32 and e/16 (every value below 32), so a heavy key, which is most
// of the traffic, takes the lock for one arrival in 16 to 32; an entry may lag
// its key's estimate by up to 1/16, and a key crossing the minimum may enter
// that much late. An entry keeps the estimate of its last accepted offer, so
// an idle key's entry is stale until it is pushed out; re-read
// Sketch.Estimate for current values.
//
// The zero TopK is not usable: create one with NewTopK. A TopK is safe for
// concurrent use and must not be copied.
type TopK struct {
	_     noCopy
	floor atomic.Uint32 // the smallest estimate held when full, else 0

	mu    sync.Mutex
	k     int
	heap  []TopEntry // min-heap by Estimate
	index map[string]int
}

// TopEntry is one key of a TopK and its estimate.
type TopEntry struct {
	Key      string
	Estimate uint32
}

// NewTopK returns a TopK of k keys. It panics if k < 1.
func NewTopK(k int) *TopK {
	if k < 1 {
		panic("epochsketch: NewTopK needs k >= 1")
	}
	return &TopK{k: k, heap: make([]TopEntry, 0, k), index: make(map[string]int, k)}
}

// Offer records key's latest estimate.
func (t *TopK) Offer(key string, estimate uint32) {
	if skip(estimate, t.floor.Load()) {
		return
	}
	t.mu.Lock()
	if i, ok := t.index[key]; ok {
		t.update(i, estimate)
	} else {
		t.insert(key, estimate)
	}
	t.mu.Unlock()
}

// OfferBytes is Offer for a key in a byte slice; the key is copied only when
// it enters.
func (t *TopK) OfferBytes(key []byte, estimate uint32) {
	if skip(estimate, t.floor.Load()) {
		return
	}
	t.mu.Lock()
	if i, ok := t.index[string(key)]; ok { // a map lookup by string(b) does not allocate
		t.update(i, estimate)
	} else {
		t.insert(string(key), estimate)
	}
	t.mu.Unlock()
}

// skip reports whether an offer can be dropped without taking the lock: it
// is not above the floor, or it falls between sampling steps (step
// 2^(bits(e)-5), between e/32 and e/16).
func skip(estimate, floor uint32) bool {
	if estimate <= floor {
		return true
	}
	if n := bits.Len32(estimate); n > 5 {
		return estimate&(1<<(n-5)-1) != 0
	}
	return false
}

func (t *TopK) update(i int, estimate uint32) {
	t.heap[i].Estimate = estimate
	t.up(i)
	t.down(i)
	t.setFloor()
}

func (t *TopK) insert(key string, estimate uint32) {
	switch {
	case len(t.heap) < t.k:
		t.heap = append(t.heap, TopEntry{key, estimate})
		t.index[key] = len(t.heap) - 1
		t.up(len(t.heap) - 1)
	case estimate > t.heap[0].Estimate:
		delete(t.index, t.heap[0].Key)
		t.heap[0] = TopEntry{key, estimate}
		t.index[key] = 0
		t.down(0)
	}
	t.setFloor()
}

// setFloor publishes the smallest estimate once the TopK is full: below it an
// offer cannot change anything.
func (t *TopK) setFloor() {
	if len(t.heap) == t.k {
		t.floor.Store(t.heap[0].Estimate)
	}
}

// List returns the entries, largest estimate first (ties by key).
func (t *TopK) List() []TopEntry {
	t.mu.Lock()
	out := append([]TopEntry(nil), t.heap...)
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Estimate != out[j].Estimate {
			return out[i].Estimate > out[j].Estimate
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// Len returns the number of entries (at most k).
func (t *TopK) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.heap)
}

func (t *TopK) less(i, j int) bool { return t.heap[i].Estimate < t.heap[j].Estimate }

func (t *TopK) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.index[t.heap[i].Key] = i
	t.index[t.heap[j].Key] = j
}

func (t *TopK) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(i, p) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

func (t *TopK) down(i int) {
	n := len(t.heap)
	for {
		c := 2*i + 1
		if c >= n {
			return
		}
		if c+1 < n && t.less(c+1, c) {
			c++
		}
		if !t.less(c, i) {
			return
		}
		t.swap(i, c)
		i = c
	}
}
