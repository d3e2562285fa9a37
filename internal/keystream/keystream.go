// Package keystream generates benchmark key streams before timing: each
// stream is laid out in the order it is consumed, in one pointer-free buffer,
// so the garbage collector never scans it and reading the next key is a
// sequential read. The core benchmarks and the peer harness (bench/) share it.
package keystream

import (
	"math/rand/v2"
	"strconv"
	"unsafe"
)

// Stream is a sequence of keys.
type Stream struct {
	Name string
	buf  []byte
	off  []uint32 // key i is buf[off[i]:off[i+1]]
}

// Len is the number of keys in the stream.
func (s *Stream) Len() int { return len(s.off) - 1 }

// Bytes is key i mod Len, without copying.
func (s *Stream) Bytes(i int) []byte {
	i %= s.Len()
	return s.buf[s.off[i]:s.off[i+1]:s.off[i+1]]
}

// String is key i mod Len as a string view of the buffer, which is never
// written after construction.
func (s *Stream) String(i int) string {
	b := s.Bytes(i)
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// FromIDs lays out the keys prefix+hex(scrambled id) for ids, in order.
func FromIDs(name, prefix string, ids []uint32) *Stream {
	s := &Stream{Name: name, off: make([]uint32, 0, len(ids)+1)}
	for _, id := range ids {
		s.off = append(s.off, uint32(len(s.buf)))
		s.buf = append(s.buf, prefix...)
		s.buf = strconv.AppendUint(s.buf, uint64(id)*2654435761%(1<<32), 16)
	}
	s.off = append(s.off, uint32(len(s.buf)))
	return s
}

// FromWords lays out words, in order.
func FromWords(name string, words []string) *Stream {
	s := &Stream{Name: name, off: make([]uint32, 0, len(words)+1)}
	for _, w := range words {
		s.off = append(s.off, uint32(len(s.buf)))
		s.buf = append(s.buf, w...)
	}
	s.off = append(s.off, uint32(len(s.buf)))
	return s
}

// Zipf is 2^22 arrivals, Zipf(1.1) over 1M keys.
func Zipf(seed uint64) *Stream {
	r := rand.New(rand.NewPCG(seed, 2))
	z := rand.NewZipf(r, 1.1, 1, 1_000_000-1)
	ids := make([]uint32, 1<<22)
	for i := range ids {
		ids[i] = uint32(z.Uint64())
	}
	return FromIDs("zipf1.1-1M", "api_client:", ids)
}

// Uniform is a flood of 10M distinct keys in random order: every call misses.
func Uniform(seed uint64) *Stream {
	r := rand.New(rand.NewPCG(seed, 3))
	ids := make([]uint32, 10_000_000)
	for i := range ids {
		ids[i] = uint32(i)
	}
	r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	return FromIDs("uniform-10M", "flood:", ids)
}

// Hot is one key.
func Hot() *Stream { return FromIDs("hot", "hot:", []uint32{0}) }

// Disjoint is n keys per goroutine slot, for 64 slots: slot g's keys are
// String(g*n + i).
func Disjoint(n int) *Stream {
	ids := make([]uint32, 64*n)
	for i := range ids {
		ids[i] = uint32(i)
	}
	return FromIDs("disjoint", "tenant:", ids)
}
