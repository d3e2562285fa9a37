// Package admit hands package limit the sketch's conditional add, outside the
// library's API: add n occurrences of a key only if its decayed count plus n
// stays within a limit, in one compare-and-swap. Package epochsketch fills
// in its functions when it starts.
package admit

import "time"

// Func adds n to key's count at time t (the zero t means the sketch's clock)
// only if the decayed count plus n stays within limit. It returns what it
// read (the count after the add, or the count that refused it, with the
// internal count behind it in a smooth sketch (SetSmooth), and the tick and
// step it used: Unix time divided by the tick duration, raised to the
// latest tick the sketch has used) and whether it added. A refusal of a
// new key by the overflow policy (Overflow) has Pressure set in its Est,
// beside the count of the weakest key of its bucket.
type Func func(t time.Time, key string, n, limit uint32) (r Reading, ok bool)

// BytesFunc is Func for a key held in a byte slice: the same key space as
// Func with string(key), without the conversion. It also reports whether
// the add was the key's first sighting in its tick (Observe's first), which
// SketchProxy's engine needs to teach its memory of keys.
type BytesFunc func(t time.Time, key []byte, n, limit uint32) (r Reading, ok, first bool)

// AllowFunc is Func at the sketch's clock for a caller that needs only
// whether it added: package limit's Allow, on its hot path.
type AllowFunc func(key string, n, limit uint32) bool

// Pressure is the bit of a Func's est that marks a new key refused because
// its bucket is full of keys at their limit (Refuse, or Share's key that
// won no slot); the rest of est is the count of the bucket's weakest key.
const Pressure = 1 << 30

// Overflow is what a conditional add does with a new key whose bucket is
// full of keys at their limit: keys whose count is at least half the limit
// (at the limit within the last tick).
type Overflow uint8

const (
	// Admit runs the lottery against the weakest key as Observe does: a
	// win evicts it, a loss admits the new key untracked.
	Admit Overflow = iota
	// Refuse refuses the new key, writing nothing: keys at their limit are
	// never evicted by new keys.
	Refuse
	// Share treats a quarter of such adds, drawn at random, as Admit does,
	// and refuses the rest as Refuse does.
	Share
)

// Counts are a sketch's conditional-add outcomes since New.
type Counts struct {
	Untracked      uint64 // admitted untracked
	Evictions      uint64 // slots taken from a live key
	EvictedAtLimit uint64 // of those, from a key at its limit
	ChippedAtLimit uint64 // challenges that chipped a key at its limit
	RefusedNew     uint64 // new keys refused by the overflow policy
	Contended      uint64 // refused after 4 lost compare-and-swaps
}

var (
	bindAllow func(sk any) AllowFunc
	bind      func(sk any) (Func, BytesFunc)
	setOver   func(sk any, o Overflow)
	counts    func(sk any) Counts
	forget    func(sk any, key string)
	setSmooth func(sk any)
	read      func(sk any, t time.Time, key []byte) Reading
)

// RegisterAllow is called once, by package epochsketch.
func RegisterAllow(b func(sk any) AllowFunc) { bindAllow = b }

// BindAllow returns sk's AllowFunc.
func BindAllow(sk any) AllowFunc { return bindAllow(sk) }

// RegisterSmooth is called once, by package epochsketch.
func RegisterSmooth(set func(sk any), r func(sk any, t time.Time, key []byte) Reading) {
	setSmooth, read = set, r
}

// SetSmooth makes sk, a *epochsketch.Sketch, smooth: its counts read lower
// in Steps steps per tick instead of halving at once at the tick's end
// (smooth.go, and docs/DESIGN.md, Smooth decay). Call it before sk is
// shared, and before anything is counted in it.
func SetSmooth(sk any) { setSmooth(sk) }

// Read reads key's count in sk at t (the zero t: sk's clock) without
// writing anything: the Reading an add that never fits would return.
func Read(sk any, t time.Time, key []byte) Reading { return read(sk, t, key) }

// Register is called once, by package epochsketch.
func Register(b func(sk any) (Func, BytesFunc)) { bind = b }

// RegisterOps is called once, by package epochsketch.
func RegisterOps(set func(sk any, o Overflow), c func(sk any) Counts, f func(sk any, key string)) {
	setOver, counts, forget = set, c, f
}

// Bind returns the conditional adds of sk, a *epochsketch.Sketch.
func Bind(sk any) (Func, BytesFunc) { return bind(sk) }

// SetOverflow sets sk's overflow policy. Call it before sk is shared: the
// policy is read without synchronization.
func SetOverflow(sk any, o Overflow) { setOver(sk, o) }

// CountsOf returns sk's conditional-add counts.
func CountsOf(sk any) Counts { return counts(sk) }

// Forget clears key's count in sk: its next add is a new key's. A key
// sharing its bucket and fingerprint shares the count, and is cleared too.
func Forget(sk any, key string) { forget(sk, key) }
