// Package bench sets EpochSketch beside what users would pick instead, on the
// same pre-generated streams in one run. It is its own module so that the
// peers never enter the library's dependencies.
package bench

import (
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/go-chi/httprate"
	"github.com/puzpuzpuz/xsync/v4"
	boom "github.com/tylertreat/BoomFilters"
	"golang.org/x/time/rate"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/internal/floor"
)

// Counter is one peer: Observe records an occurrence of key and returns what
// the peer answers per call (a count, or 1/0 for allow/deny).
type Counter interface {
	Observe(key string) uint32
}

// Peer is a named constructor.
type Peer struct {
	Name string
	New  func() Counter
	// Fixed is true for structures whose memory does not grow with keys.
	Fixed bool
}

// TableBuckets sizes every fixed-memory peer at 4 MiB.
const TableBuckets = 1 << 16

// BoomFilters sizes a Count-Min sketch as width ceil(e/epsilon) × depth
// ceil(ln(1/delta)) 64-bit counters: these give 4 rows of 131,072, 4 MiB.
var (
	cmEpsilon = math.E / 131072
	cmDelta   = math.Exp(-4) * 1.001
)

// Peers lists every structure, floors first.
var Peers = []Peer{
	{"floor-hash-add", func() Counter { return newFloor(floor.HashAdd) }, true},
	{"floor-hash-cas", func() Counter { return newFloor(floor.HashCAS) }, true},
	{"floor-hash-bucket-cas", func() Counter { return newFloor(floor.HashBucketCAS) }, true},
	{"epochsketch", func() Counter { return newES(epochsketch.HashWyhash) }, true},
	{"epochsketch-siphash13", func() Counter { return newES(epochsketch.HashSipHash13) }, true},
	{"mutex-map", func() Counter { return &mutexMap{m: map[string]uint32{}} }, false},
	{"sync.Map", func() Counter { return &syncMap{} }, false},
	{"xsync.Map", func() Counter { return &xsyncMap{m: xsync.NewMap[string, *atomic.Uint32]()} }, false},
	{"xtime-rate-map", func() Counter { return &rateMap{m: map[string]*rate.Limiter{}} }, false},
	{"httprate-local", func() Counter { return newHTTPRate() }, false},
	{"boom-countmin", func() Counter { return &boomCM{c: boom.NewCountMinSketch(cmEpsilon, cmDelta)} }, true},
	{"boom-topk", func() Counter { return &boomTopK{t: boom.NewTopK(cmEpsilon, cmDelta, 100)} }, true},
	{"boom-stablebloom", func() Counter {
		return &boomStable{f: boom.NewDefaultStableBloomFilter(TableBuckets*64*8, 0.01)} // 4 MiB of 1-bit cells
	}, true},
	{"tinylfu-style", func() Counter { return newTinyLFU(4 << 20) }, true},
}

// floorPeer adapts internal/floor: it answers the count after the call.
type floorPeer struct{ f *floor.Floor }

func newFloor(kind floor.Kind) Counter { return floorPeer{floor.New(kind, TableBuckets)} }

func (p floorPeer) Observe(k string) uint32 { return uint32(p.f.Observe(k) + 1) }

type es struct{ sk *epochsketch.Sketch }

func newES(h epochsketch.HashKind) *es {
	return &es{epochsketch.New(epochsketch.Config{NumBuckets: TableBuckets, Hash: h})}
}

func (e *es) Observe(k string) uint32 { n, _ := e.sk.Observe(k); return n }

// mutexMap is the exact map most code starts with.
type mutexMap struct {
	mu sync.Mutex
	m  map[string]uint32
}

func (m *mutexMap) Observe(k string) uint32 {
	m.mu.Lock()
	n, ok := m.m[k]
	if !ok {
		k = clone(k) // the map keeps the key: copy it out of the stream buffer
	}
	n++
	m.m[k] = n
	m.mu.Unlock()
	return n
}

type syncMap struct{ m sync.Map }

func (s *syncMap) Observe(k string) uint32 {
	if v, ok := s.m.Load(k); ok {
		return v.(*atomic.Uint32).Add(1)
	}
	v, _ := s.m.LoadOrStore(clone(k), new(atomic.Uint32))
	return v.(*atomic.Uint32).Add(1)
}

type xsyncMap struct {
	m *xsync.Map[string, *atomic.Uint32]
}

func (x *xsyncMap) Observe(k string) uint32 {
	if v, ok := x.m.Load(k); ok {
		return v.Add(1)
	}
	v, _ := x.m.LoadOrStore(clone(k), new(atomic.Uint32))
	return v.Add(1)
}

// rateMap is the usual per-key limiter: a map of x/time/rate limiters (100 per
// second, burst 100) under a mutex. It answers allow (1) or deny (0).
type rateMap struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (r *rateMap) Observe(k string) uint32 {
	r.mu.Lock()
	l, ok := r.m[k]
	if !ok {
		l = rate.NewLimiter(100, 100)
		r.m[clone(k)] = l
	}
	r.mu.Unlock()
	if l.Allow() {
		return 1
	}
	return 0
}

// httpRate is go-chi/httprate's in-memory sliding-window counter, called as
// its limiter does: read the current and previous windows, then increment.
type httpRate struct {
	c      httprate.LimitCounter
	window time.Duration
}

func newHTTPRate() *httpRate {
	c := httprate.NewLocalLimitCounter(time.Second)
	c.Config(100, time.Second)
	return &httpRate{c: c, window: time.Second}
}

func (h *httpRate) Observe(k string) uint32 {
	now := time.Now().UTC().Truncate(h.window)
	cur, _, _ := h.c.Get(k, now, now.Add(-h.window))
	_ = h.c.Increment(k, now)
	return uint32(cur + 1)
}

// The BoomFilters structures are not safe for concurrent use: a mutex, as
// their users add.
type boomCM struct {
	mu sync.Mutex
	c  *boom.CountMinSketch
}

func (b *boomCM) Observe(k string) uint32 {
	d := bytesOf(k)
	b.mu.Lock()
	b.c.Add(d)
	n := b.c.Count(d)
	b.mu.Unlock()
	return uint32(n)
}

type boomTopK struct {
	mu sync.Mutex
	t  *boom.TopK
}

func (b *boomTopK) Observe(k string) uint32 {
	b.mu.Lock()
	b.t.Add(bytesOf(k))
	b.mu.Unlock()
	return 1
}

// boomStable answers the first-sighting question (1 = seen recently).
type boomStable struct {
	mu sync.Mutex
	f  *boom.StableBloomFilter
}

func (b *boomStable) Observe(k string) uint32 {
	b.mu.Lock()
	seen := b.f.TestAndAdd(bytesOf(k))
	b.mu.Unlock()
	if seen {
		return 1
	}
	return 0
}

// tinyLFU is a TinyLFU-style frequency sketch: 4 rows of 4-bit saturating
// counters (two per byte) in the given bytes, every counter halved after
// 10 × width additions (the periodic reset this project's design removes),
// under a mutex.
type tinyLFU struct {
	mu    sync.Mutex
	seed  maphash.Seed
	rows  [4][]byte
	w     uint64
	n, at int
}

func newTinyLFU(bytes int) *tinyLFU {
	t := &tinyLFU{seed: maphash.MakeSeed(), w: uint64(bytes / 4 * 2)}
	for i := range t.rows {
		t.rows[i] = make([]byte, bytes/4)
	}
	t.at = int(t.w) * 10
	return t
}

func (t *tinyLFU) Observe(k string) uint32 {
	h := maphash.String(t.seed, k)
	t.mu.Lock()
	est := uint32(15)
	for i := range t.rows {
		h = h*0x9e3779b97f4a7c15 + 1
		j := (h >> 32) * t.w >> 32
		b := &t.rows[i][j/2]
		shift := (j % 2) * 4
		c := uint32(*b>>shift) & 15
		if c < 15 {
			c++
			*b = *b&^(15<<shift) | byte(c)<<shift
		}
		est = min(est, c)
	}
	if t.n++; t.n == t.at {
		t.n = 0
		for i := range t.rows {
			for j, b := range t.rows[i] {
				t.rows[i][j] = (b >> 1) & 0x77
			}
		}
	}
	t.mu.Unlock()
	return est
}

func bytesOf(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

func clone(s string) string { return string(append([]byte(nil), s...)) }
