// Package inspect reads what a Sketch holds, for the tools that show it (the
// browser simulator, THEORY.md's experiments) and the tests: where a key
// lives, the raw slot words of a bucket, and what a restored snapshot held
// (for SketchProxy's state file, which carries several). It is not part of the library's
// API: package epochsketch fills in its functions when it starts.
package inspect

import (
	"io"
	"time"
)

// The functions package epochsketch provides; sk is a *epochsketch.Sketch.
var (
	locate func(sk any, key string) (bucket, second int, tag uint16)
	slots  func(sk any, i int) [8]uint64
	decay  func(w uint64, now int64) uint32
	read   func(sk any, r io.Reader) (Restored, error)
)

// Restored is what ReadFrom found in a snapshot.
type Restored struct {
	Saved   time.Time // wall-clock time of the snapshot
	Live    int       // slots restored
	Expired int       // slots dropped: they read 0 after the downtime
}

// ReadFrom is sk.ReadFrom (sk is a *epochsketch.Sketch) that also says what
// the snapshot held, as LoadFile does for a file.
func ReadFrom(sk any, r io.Reader) (Restored, error) { return read(sk, r) }

// Register is called once, by package epochsketch.
func Register(l func(any, string) (int, int, uint16), s func(any, int) [8]uint64, d func(uint64, int64) uint32, r func(any, io.Reader) (Restored, error)) {
	locate, slots, decay, read = l, s, d, r
}

// Locate returns where key lives in sk (a *epochsketch.Sketch): its bucket,
// its second candidate bucket with TwoChoice (else -1), and its fingerprint.
// It writes nothing.
func Locate(sk any, key string) (bucket, second int, tag uint16) { return locate(sk, key) }

// Slots returns the 8 slot words of bucket i of sk, each read atomically
// (the bucket as a whole is not a snapshot under concurrent writers). It
// panics if i is out of range.
func Slots(sk any, i int) [8]uint64 { return slots(sk, i) }

// Fields decodes a slot word into its fingerprint, epoch (tick mod 2^24) and
// raw count (docs/DESIGN.md, Slots); the word 0 is an empty slot.
func Fields(w uint64) (tag uint16, epoch, count uint32) {
	return uint16(w >> 48), uint32(w>>24) & (1<<24 - 1), uint32(w) & (1<<24 - 1)
}

// Decayed is the count a slot word reads at tick now: count >> (now - epoch)
// mod 2^24, clamped at 63.
func Decayed(w uint64, now int64) uint32 { return decay(w, now) }
