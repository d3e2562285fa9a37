package sim

import (
	"container/heap"
	"math"
	"math/rand/v2"

	"github.com/epochsketch/epochsketch"
)

// HH is a heavy-hitter structure in HeavyKeeper's evaluation setup: insert
// the whole stream (no decay), then report the top k and answer point
// queries. Every structure gets the same memory budget.
type HH interface {
	Insert(key string)
	Query(key string) uint64
	Top() []KV
}

// heapEntryBytes is what a reported key costs in a top-k heap: a 16-byte key
// identifier, a 4-byte count and a 4-byte index (assumed, as in the
// HeavyKeeper paper's accounting of its min-heap).
const heapEntryBytes = 24

// hashKey is the comparators' seeded hash: FNV-1a over the bytes, finished
// with splitmix64's avalanche so every output bit depends on every input bit.
func hashKey(seed uint64, s string) uint64 {
	h := seed ^ 0xcbf29ce484222325
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 0x100000001b3
	}
	return splitmix(h)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// topHeap keeps the k keys with the largest reported counts (a keyed
// min-heap: HeavyKeeper's, and the one every sketch here reports through).
type topHeap struct {
	k     int
	items []KV
	index map[string]int
}

func newTopHeap(k int) *topHeap { return &topHeap{k: k, index: map[string]int{}} }

func (h *topHeap) Len() int           { return len(h.items) }
func (h *topHeap) Less(i, j int) bool { return h.items[i].Count < h.items[j].Count }
func (h *topHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.index[h.items[i].Key] = i
	h.index[h.items[j].Key] = j
}
func (h *topHeap) Push(x any) { h.index[x.(KV).Key] = len(h.items); h.items = append(h.items, x.(KV)) }
func (h *topHeap) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	delete(h.index, x.Key)
	return x
}

// offer records key's latest estimate.
func (h *topHeap) offer(key string, est uint64) {
	if i, ok := h.index[key]; ok {
		h.items[i].Count = est
		heap.Fix(h, i)
		return
	}
	if len(h.items) < h.k {
		heap.Push(h, KV{key, est})
		return
	}
	if est > h.items[0].Count {
		delete(h.index, h.items[0].Key)
		h.items[0] = KV{key, est}
		h.index[key] = 0
		heap.Fix(h, 0)
	}
}

func (h *topHeap) top() []KV {
	out := append([]KV(nil), h.items...)
	SortKV(out)
	return out
}

// esHH is EpochSketch with its default lottery, the stream in one tick, and
// the top-k heap fed by Observe's estimate.
type esHH struct {
	sk  *ES
	top *topHeap
}

func newESHH(budget, k int, lot Lottery, seed uint64) *esHH {
	buckets := max((budget-k*heapEntryBytes)/64, 1)
	return &esHH{NewES(buckets, lot, false, seed), newTopHeap(k)}
}

func (e *esHH) Insert(key string)       { e.top.offer(key, uint64(e.sk.Observe(key, 0))) }
func (e *esHH) Query(key string) uint64 { return uint64(e.sk.Estimate(key, 0)) }
func (e *esHH) Top() []KV               { return e.top.top() }

// esTopK is EpochSketch reporting through the library's own TopK, bound to
// the sketch (TopK.Observe): what a user reads.
type esTopK struct {
	sk  *ES
	top *epochsketch.TopK
}

func newESTopK(budget, k int, seed uint64) *esTopK {
	buckets := max((budget-k*heapEntryBytes)/64, 1)
	sk := NewES(buckets, HeavyKeeper, false, seed)
	return &esTopK{sk, epochsketch.NewTopKFor(sk.Sk, k)}
}

func (e *esTopK) Insert(key string)       { e.top.Observe(key) }
func (e *esTopK) Query(key string) uint64 { return uint64(e.sk.Estimate(key, 0)) }
func (e *esTopK) Top() []KV {
	var out []KV
	for _, x := range e.top.List() {
		out = append(out, KV{x.Key, uint64(x.Estimate)})
	}
	return out
}

// esEstimate is EpochSketch's top k by Estimate over every key of the
// stream: the best the sketch's counts allow, with a key list no sketch
// keeps (so its memory is the sketch's alone, not comparable).
type esEstimate struct {
	sk   *ES
	k    int
	seen map[string]bool
}

func newESEstimate(budget, k int, seed uint64) *esEstimate {
	buckets := max((budget-k*heapEntryBytes)/64, 1)
	return &esEstimate{NewES(buckets, HeavyKeeper, false, seed), k, map[string]bool{}}
}

func (e *esEstimate) Insert(key string)       { e.sk.Observe(key, 0); e.seen[key] = true }
func (e *esEstimate) Query(key string) uint64 { return uint64(e.sk.Estimate(key, 0)) }
func (e *esEstimate) Top() []KV {
	all := make([]KV, 0, len(e.seen))
	for key := range e.seen {
		all = append(all, KV{key, uint64(e.sk.Estimate(key, 0))})
	}
	SortKV(all)
	return all[:min(e.k, len(all))]
}

// hgHH is HeavyKeeper in HeavyGuardian's layout: buckets of 8 cells of a
// 16-bit fingerprint and a 16-bit count (4 bytes, half an EpochSketch slot,
// and no epoch); a miss on a full bucket decays the weakest cell with
// probability 1.08^-C (or 1/floor(1.08^C), as the authors' C++ does), and the
// newcomer takes a cell that reaches 0.
type hgHH struct {
	cells []uint32 // fp<<16 | count
	nb    uint64
	cpp   bool
	rng   *rand.Rand
	seed  uint64
	top   *topHeap
}

func newHGHH(budget, k int, cpp bool, seed uint64) *hgHH {
	nb := max((budget-k*heapEntryBytes)/32, 1)
	return &hgHH{cells: make([]uint32, nb*8), nb: uint64(nb), cpp: cpp,
		rng: rand.New(rand.NewPCG(seed, 0x4847)), seed: seed, top: newTopHeap(k)}
}

func hkDecay(rng *rand.Rand, c uint32, cpp bool) bool {
	if cpp {
		return rng.Float64() < 1/math.Floor(math.Pow(1.08, float64(c)))
	}
	return rng.Float64() < math.Pow(1.08, -float64(c))
}

func (g *hgHH) slot(key string) ([]uint32, uint32) {
	h := hashKey(g.seed, key)
	b := (h >> 32) * g.nb >> 32
	fp := uint32(h>>16) & 0xffff
	return g.cells[b*8 : b*8+8], fp
}

func (g *hgHH) Insert(key string) {
	cells, fp := g.slot(key)
	weak := 0
	for i, c := range cells {
		if c>>16 == fp && c&0xffff > 0 {
			if c&0xffff < 0xffff {
				cells[i]++
			}
			g.top.offer(key, uint64(cells[i]&0xffff))
			return
		}
		if c&0xffff < cells[weak]&0xffff {
			weak = i
		}
	}
	if cells[weak]&0xffff == 0 {
		cells[weak] = fp<<16 | 1
		g.top.offer(key, 1)
		return
	}
	if hkDecay(g.rng, cells[weak]&0xffff, g.cpp) {
		cells[weak]--
		if cells[weak]&0xffff == 0 {
			cells[weak] = fp<<16 | 1
			g.top.offer(key, 1)
		}
	}
}

func (g *hgHH) Query(key string) uint64 {
	cells, fp := g.slot(key)
	for _, c := range cells {
		if c>>16 == fp && c&0xffff > 0 {
			return uint64(c & 0xffff)
		}
	}
	return 0
}

func (g *hgHH) Top() []KV { return g.top.top() }

// hkHH is HeavyKeeper as published: d = 2 arrays of (16-bit fingerprint,
// 16-bit count) buckets and a min-heap of k; on a fingerprint miss only the
// smallest of the candidate counts decays ("minimum decay"), with
// probability 1.08^-C, and a bucket at 0 is taken by the newcomer.
type hkHH struct {
	arr  [2][]uint32
	w    uint64
	rng  *rand.Rand
	seed uint64
	top  *topHeap
}

func newHKHH(budget, k int, seed uint64) *hkHH {
	w := max((budget-k*heapEntryBytes)/8, 1)
	return &hkHH{arr: [2][]uint32{make([]uint32, w), make([]uint32, w)}, w: uint64(w),
		rng: rand.New(rand.NewPCG(seed, 0x484b)), seed: seed, top: newTopHeap(k)}
}

func (h *hkHH) idx(key string) (i [2]uint64, fp uint32) {
	x := hashKey(h.seed, key)
	fp = uint32(x) & 0xffff
	i[0] = (x >> 32) * h.w >> 32
	i[1] = (splitmix(x) >> 32) * h.w >> 32
	return i, fp
}

func (h *hkHH) Insert(key string) {
	ix, fp := h.idx(key)
	var est uint32
	minJ, minC := -1, uint32(math.MaxUint32)
	for j := range 2 {
		c := h.arr[j][ix[j]]
		switch {
		case c&0xffff == 0:
			h.arr[j][ix[j]] = fp<<16 | 1
			est = max(est, 1)
		case c>>16 == fp:
			if c&0xffff < 0xffff {
				h.arr[j][ix[j]]++
			}
			est = max(est, h.arr[j][ix[j]]&0xffff)
		default:
			if c&0xffff < minC {
				minJ, minC = j, c&0xffff
			}
		}
	}
	if est == 0 && minJ >= 0 && hkDecay(h.rng, minC, false) {
		h.arr[minJ][ix[minJ]]--
		if h.arr[minJ][ix[minJ]]&0xffff == 0 {
			h.arr[minJ][ix[minJ]] = fp<<16 | 1
			est = 1
		}
	}
	if est > 0 {
		h.top.offer(key, uint64(est))
	}
}

func (h *hkHH) Query(key string) uint64 {
	ix, fp := h.idx(key)
	var est uint32
	for j := range 2 {
		if c := h.arr[j][ix[j]]; c>>16 == fp {
			est = max(est, c&0xffff)
		}
	}
	return uint64(est)
}

func (h *hkHH) Top() []KV { return h.top.top() }

// ssHH is Space-Saving (Metwally et al.): m monitored keys; a new key
// replaces the minimum and inherits its count + 1. A counter costs a key, a
// count, an error and a heap index: 32 bytes.
type ssHH struct{ h *topHeap }

func newSSHH(budget int) *ssHH { return &ssHH{newTopHeap(max(budget/32, 1))} }

func (s *ssHH) Insert(key string) {
	if i, ok := s.h.index[key]; ok {
		s.h.items[i].Count++
		heap.Fix(s.h, i)
		return
	}
	if s.h.Len() < s.h.k {
		heap.Push(s.h, KV{key, 1})
		return
	}
	s.h.offer(key, s.h.items[0].Count+1)
}

func (s *ssHH) Query(key string) uint64 {
	if i, ok := s.h.index[key]; ok {
		return s.h.items[i].Count
	}
	return 0
}

func (s *ssHH) Top() []KV { return s.h.top() }

// cmHH is a Count-Min sketch (d = 4 rows of 32-bit counters) with a top-k
// heap. With halve > 0 it is TinyLFU-style: 4-bit saturating counters, and
// every halve insertions every counter is halved (the periodic reset).
type cmHH struct {
	rows  [4][]uint32
	w     uint64
	max   uint32
	halve int
	n     int
	seed  uint64
	top   *topHeap
}

func newCMHH(budget, k int, seed uint64, tiny bool) *cmHH {
	rest := budget - k*heapEntryBytes
	c := &cmHH{max: math.MaxUint32, seed: seed, top: newTopHeap(k)}
	if tiny {
		c.w = uint64(max(rest*2/4, 1)) // 4-bit counters: 2 per byte
		c.max = 15
		c.halve = int(c.w) * 10
	} else {
		c.w = uint64(max(rest/16, 1))
	}
	for i := range c.rows {
		c.rows[i] = make([]uint32, c.w)
	}
	return c
}

func (c *cmHH) cols(key string) [4]uint64 {
	x := hashKey(c.seed, key)
	var out [4]uint64
	for i := range out {
		x = splitmix(x)
		out[i] = (x >> 32) * c.w >> 32
	}
	return out
}

func (c *cmHH) Insert(key string) {
	est := uint32(math.MaxUint32)
	for i, j := range c.cols(key) {
		if c.rows[i][j] < c.max {
			c.rows[i][j]++
		}
		est = min(est, c.rows[i][j])
	}
	c.top.offer(key, uint64(est))
	if c.halve > 0 {
		if c.n++; c.n == c.halve {
			c.n = 0
			for i := range c.rows {
				for j := range c.rows[i] {
					c.rows[i][j] >>= 1
				}
			}
		}
	}
}

func (c *cmHH) Query(key string) uint64 {
	est := uint32(math.MaxUint32)
	for i, j := range c.cols(key) {
		est = min(est, c.rows[i][j])
	}
	return uint64(est)
}

func (c *cmHH) Top() []KV { return c.top.top() }

// Peers builds every structure of section 7 at one memory budget.
func Peers(budget, k int, seed uint64) []struct {
	Name string
	HH   HH
} {
	return []struct {
		Name string
		HH   HH
	}{
		{"EpochSketch", newESHH(budget, k, HeavyKeeper, seed)},
		{"EpochSketch via TopK", newESTopK(budget, k, seed)},
		{"EpochSketch by Estimate", newESEstimate(budget, k, seed)},
		{"EpochSketch-chip", newESHH(budget, k, Chip, seed)},
		{"HK-HG layout", newHGHH(budget, k, false, seed)},
		{"HK-HG C++ rounding", newHGHH(budget, k, true, seed)},
		{"HeavyKeeper d=2", newHKHH(budget, k, seed)},
		{"Space-Saving", newSSHH(budget)},
		{"CM+heap", newCMHH(budget, k, seed, false)},
		{"TinyLFU-style", newCMHH(budget, k, seed, true)},
	}
}
