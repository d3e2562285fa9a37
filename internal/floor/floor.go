// Package floor holds the physical floors the benchmarks compare against:
// what no structure of EpochSketch's shape can beat on the same table size.
// The core benchmarks and the peer harness (bench/) share it.
package floor

import (
	"hash/maphash"
	"sync/atomic"
)

// Kind selects a floor.
type Kind int

const (
	HashAdd       Kind = iota // seeded maphash, then one atomic add
	HashCAS                   // seeded maphash, then one load and one CAS
	HashBucketCAS             // seeded maphash, read an 8-word bucket, CAS one word
)

// Floor is one floor on a table of buckets × 8 words.
type Floor struct {
	seed  maphash.Seed
	kind  Kind
	words []atomic.Uint64
}

// New returns a floor of the given kind over buckets × 64 bytes.
func New(kind Kind, buckets int) *Floor {
	return &Floor{seed: maphash.MakeSeed(), kind: kind, words: make([]atomic.Uint64, buckets*8)}
}

// Observe does the floor's work for key and returns the word it read.
func (f *Floor) Observe(k string) uint64 {
	h := maphash.String(f.seed, k)
	switch f.kind {
	case HashAdd:
		return f.words[(h>>32)*uint64(len(f.words))>>32].Add(1) - 1
	case HashCAS:
		w := &f.words[(h>>32)*uint64(len(f.words))>>32]
		x := w.Load()
		w.CompareAndSwap(x, x+1)
		return x
	}
	b := f.words[((h>>32)*uint64(len(f.words)/8)>>32)*8:][:8]
	tag := h >> 48
	j, x := 0, uint64(0)
	for i := range b {
		if w := b[i].Load(); w>>48 == tag {
			j, x = i, w
		}
	}
	b[j].CompareAndSwap(x, tag<<48|(x+1)&(1<<48-1))
	return x
}
