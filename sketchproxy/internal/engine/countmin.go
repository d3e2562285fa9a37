package engine

import (
	"hash/maphash"
	"sync/atomic"
)

// CountMin counts per (rule, key) in fixed memory: two rows of counters; a
// key's count is the smaller of its two (never below the truth, rarely
// above). It holds what is given back when a request ends (in-flight
// places, wallets' reservations), so it is exact for a key alone in its
// cells and never forgets one.
type CountMin struct {
	seed maphash.Seed
	rows [2][1 << 12]atomic.Int64
}

// NewCountMin returns an empty CountMin with a random seed.
func NewCountMin() *CountMin { return &CountMin{seed: maphash.MakeSeed()} }

// Idx returns the key's cells in the two rows.
func (c *CountMin) Idx(rule, key string) (int, int) {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(rule)
	h.WriteByte(0)
	h.WriteString(key)
	x := h.Sum64()
	return int(x & (1<<12 - 1)), int(x >> 52)
}

// Add adds d to the key's count and returns the count.
func (c *CountMin) Add(rule, key string, d int64) int64 { return c.addAt(c.idx(rule, key), d) }

// Get returns the key's count.
func (c *CountMin) Get(rule, key string) int64 {
	i, j := c.Idx(rule, key)
	return min(c.rows[0][i].Load(), c.rows[1][j].Load())
}

// Acquire adds one unless the key already has limit.
func (c *CountMin) Acquire(rule, key string, limit int) bool {
	return c.acquireAt(c.idx(rule, key), limit)
}

// idx is Idx as one value, for addAt and acquireAt.
func (c *CountMin) idx(rule, key string) [2]int {
	i, j := c.Idx(rule, key)
	return [2]int{i, j}
}

// addAt is Add for a key's cells.
func (c *CountMin) addAt(ij [2]int, d int64) int64 {
	return min(c.rows[0][ij[0]].Add(d), c.rows[1][ij[1]].Add(d))
}

// acquireAt is Acquire for a key's cells.
func (c *CountMin) acquireAt(ij [2]int, limit int) bool {
	if c.addAt(ij, 1) > int64(limit) {
		c.addAt(ij, -1)
		return false
	}
	return true
}
