package engine

import (
	"hash/maphash"
	"math"
	"strings"
	"sync"
	"unsafe"
)

// Tally counts what requests in progress hold, per (rule, key): in-flight
// places, tarpit holds, wallets' reservations. It is exact: every key has
// its own count, in a map that holds the keys with requests in progress
// (which the server's connection limits bound) and no more idle ones than
// those plus 1,024 (idleKeys), so keys a client invents cannot raise
// another key's count. The count-min table of 2 × 4,096 cells it replaces
// could be filled that way: 8,192 invented keys holding 2 requests each
// got fresh keys refused at a cap of 2 three times in 4 (issue 46;
// TestInFlightInventedKeysCannotFill).
//
// The zero Tally is not usable: NewTally seeds it. Safe for concurrent
// use; must not be copied.
type Tally struct {
	seed   maphash.Seed
	shards [tallyShards]tallyShard
}

// tallyShards is how many locks a Tally's keys spread over: as many as
// WalletLocks' stripes, so that Shard serves both.
const tallyShards = 64

// idleKeys is how many keys at zero a shard keeps beyond twice its keys in
// use: a key whose requests come one after another finds its entry again
// and allocates nothing (TestDecideInFlightAllocates0). Keys longer than
// MaxKey are not kept idle, so that the idle keys beyond as many as are in
// use hold at most 64 × 16 × 128 bytes per Tally.
const idleKeys = 16

// cacheLine is the size the shards are padded to, so that two cores
// counting keys of neighbouring shards do not share a line
// (TestTallyShardSize).
const cacheLine = 64

// tallyKey is a count's key: the rule's name and the key.
type tallyKey struct{ rule, key string }

// tallyCount is a key's count and the Tally's own copy of the key (the
// map's key holds the same), never the caller's: a door's request need
// not outlive its decision.
type tallyCount struct {
	n   int64
	key string
}

type tallyShard struct {
	tallyFields
	_ [cacheLine - unsafe.Sizeof(tallyFields{})%cacheLine]byte
}

type tallyFields struct {
	mu    sync.Mutex
	m     map[tallyKey]tallyCount
	inUse int // keys with a count above zero
}

// NewTally returns an empty Tally with a random seed.
func NewTally() *Tally { return &Tally{seed: maphash.MakeSeed()} }

// Shard returns which of the Tally's 64 shards holds the key's count: a
// seeded hash of rule and key, which a client cannot aim.
func (t *Tally) Shard(rule, key string) int {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(rule)
	h.WriteByte(0)
	h.WriteString(key)
	return int(h.Sum64() % tallyShards)
}

// Add adds d to the key's count and returns the count. A count is never
// below zero: what is given back beyond what was taken is forgotten.
func (t *Tally) Add(rule, key string, d int64) int64 {
	sh := &t.shards[t.Shard(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n, _, _ := sh.add(rule, key, d, math.MaxInt64)
	return n
}

// Get returns the key's count.
func (t *Tally) Get(rule, key string) int64 {
	sh := &t.shards[t.Shard(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.m[tallyKey{rule, key}].n
}

// Acquire adds one to the key's count unless it has limit already, and
// reports whether it did.
func (t *Tally) Acquire(rule, key string, limit int) bool {
	_, ok := t.acquire(rule, key, limit)
	return ok
}

// acquire is Acquire that also returns the Tally's copy of key, for a
// caller that must give the place back after key's owner is gone.
func (t *Tally) acquire(rule, key string, limit int) (own string, ok bool) {
	sh := &t.shards[t.Shard(rule, key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	_, own, ok = sh.add(rule, key, 1, int64(limit))
	return own, ok
}

// InUse returns how many keys have a count above zero.
func (t *Tally) InUse() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += sh.inUse
		sh.mu.Unlock()
	}
	return n
}

// add is Add with sh locked, unless the count would pass limit (then it
// adds nothing and reports false); it also returns the Tally's copy of
// key.
func (sh *tallyShard) add(rule, key string, d, limit int64) (int64, string, bool) {
	c, found := sh.m[tallyKey{rule, key}]
	if c.n+d > limit {
		return c.n, "", false
	}
	if !found {
		if d <= 0 {
			return 0, "", true
		}
		if sh.m == nil {
			sh.m = make(map[tallyKey]tallyCount)
		}
		c.key = strings.Clone(key)
	}
	// The map keeps the Tally's copy, never key itself (nor a key built
	// from it: escape analysis would then move a door's facts to the
	// heap).
	k := tallyKey{rule, c.key}
	was := c.n
	c.n = max(0, c.n+d)
	switch {
	case was == 0 && c.n > 0:
		sh.inUse++
	case was > 0 && c.n == 0:
		sh.inUse--
	}
	if c.n == 0 && (len(key) > MaxKey || len(sh.m) > 2*sh.inUse+idleKeys) {
		delete(sh.m, k)
		sh.sweep()
		return 0, c.key, true
	}
	sh.m[k] = c
	return c.n, c.key, true
}

// sweep forgets the shard's idle keys once they outnumber twice the keys
// in use, plus idleKeys: each sweep removes at least as many keys as
// have been added since the last, so its cost is constant per key.
func (sh *tallyShard) sweep() {
	if len(sh.m) <= 2*sh.inUse+idleKeys {
		return
	}
	for k, c := range sh.m {
		if c.n == 0 {
			delete(sh.m, k)
		}
	}
}

// hold takes a tarpit place for rule's key (a delayed request held, a
// refusal dripped), or reports the tarpit's caps full: tarpitting never
// holds more than MaxHeld requests in all, MaxHeldPerKey of one key.
func (e *Engine) hold(rule, key string, t *TarpitSpec) bool {
	if e.held.Add(1) > int64(t.MaxHeld) {
		e.held.Add(-1)
		return false
	}
	if !e.heldKeys.Acquire(rule, key, t.MaxHeldPerKey) {
		e.held.Add(-1)
		return false
	}
	return true
}

// release gives a tarpit place back.
func (e *Engine) release(rule, key string) {
	e.heldKeys.Add(rule, key, -1)
	e.held.Add(-1)
}

// Held is how many requests the tarpit holds now.
func (e *Engine) Held() int64 { return e.held.Load() }
