// Package lab is the window onto a Sketch's internals for the tools of this
// module that show or steer them: the browser simulator (simulator/),
// THEORY.md's experiments (internal/sim) and the library's tests. It reads
// where a key lives and the raw slot words, switches a sketch to the
// retired chip lottery, and carries the trace of trace builds. It is not
// part of the library's API, and no other module may import it
// (imports_test.go checks that).
//
// Package epochsketch fills in the functions below when it starts: lab
// cannot import it, because it imports lab for the trace's types.
package lab

// The functions package epochsketch provides; sk is a *epochsketch.Sketch.
var (
	locate  func(sk any, key string) (bucket, second int, tag uint16)
	slots   func(sk any, i int) [8]uint64
	decay   func(w uint64, now int64) uint32
	useChip func(sk any)
)

// Register is called once, by package epochsketch.
func Register(l func(any, string) (int, int, uint16), s func(any, int) [8]uint64, d func(uint64, int64) uint32, c func(any)) {
	locate, slots, decay, useChip = l, s, d, c
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

// UseChip switches sk (a new *epochsketch.Sketch, before any other call) from
// HeavyKeeper-classic to hash-entropy chipping with chip-mask schedule M3:
// the weakest slot is chipped when the top floor(C/9) bits of a draw are
// zero, so P(chip) = 2^-floor(C/9) ≈ 1.08^-C in steps. It lost THEORY.md
// section 1's selection test and left the library's API; the simulator and
// the experiments keep it to show why. A snapshot records the lottery, and
// restores only into a sketch with the same one.
func UseChip(sk any) { useChip(sk) }
