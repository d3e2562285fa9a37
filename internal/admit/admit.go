// Package admit hands package limit the sketch's conditional add, outside the
// library's API: add n occurrences of a key only if its decayed count plus n
// stays within a limit, in one compare-and-swap. Package epochsketch fills
// in its function when it starts.
package admit

import "time"

// Func adds n to key's count at time t (the zero t means the sketch's clock)
// only if the decayed count plus n stays within limit. It returns the count
// after the add, or the count that refused it; whether it added; and the
// tick it used (Unix time divided by the tick duration, raised to the
// latest tick the sketch has used).
type Func func(t time.Time, key string, n, limit uint32) (est uint32, ok bool, tick int64)

// BytesFunc is Func for a key held in a byte slice: the same key space as
// Func with string(key), without the conversion. It also reports whether
// the add was the key's first sighting in its tick (Observe's first), which
// SketchProxy's engine needs to teach its memory of keys.
type BytesFunc func(t time.Time, key []byte, n, limit uint32) (est uint32, ok, first bool, tick int64)

var bind func(sk any) (Func, BytesFunc)

// Register is called once, by package epochsketch.
func Register(b func(sk any) (Func, BytesFunc)) { bind = b }

// Bind returns the conditional adds of sk, a *epochsketch.Sketch.
func Bind(sk any) (Func, BytesFunc) { return bind(sk) }
