// Package epochsketch tracks how often each key occurred lately, for millions
// of keys, in fixed memory, lock-free, with no background thread touching the
// table.
//
// A [Sketch] answers one question per call: [Sketch.Observe] records an
// occurrence of a key and returns its estimated recent frequency and whether
// this is its first sighting in the current tick. [Sketch.Estimate] reads
// without writing. Counts halve every tick ([Config.TickDuration]); the
// halving is interpreted when a slot is read (count >> age), so nothing ever
// sweeps memory. A [TopK] bound to a sketch ([NewTopKFor]) names its heaviest
// keys and decays with it.
//
// # Layout
//
// Each tracked key is one 64-bit word, [16-bit fingerprint | 24-bit epoch |
// 24-bit count]; eight words make a 64-byte bucket, one cache line, the only
// memory an Observe touches. Memory is [Config.NumBuckets] × 64 bytes, sized
// by the heavy hitters you must keep ([BucketsFor]), never by the number of
// distinct keys: mice may collide, be chipped and evaporate; keys with counts
// in the thousands are never evicted.
//
// # Error direction
//
// Errors go the safe way for rate limiters and anomaly detectors: an estimate
// may read low (a lost compare-and-swap race after three retries drops the
// increment, counted in [Stats]; an untracked key reads (1, true)), and reads
// high only when a different key shares the bucket and the 16-bit
// fingerprint. Counts saturate at 2^24-1 and never wrap; epochs are Unix time
// divided by the tick, mod 2^24, and a writer clears any slot silent for 24
// ticks before competing for its bucket, so a slot cannot wrap around and
// come back (see THEORY.md for the residual).
//
// # Time
//
// With the default wall clock a Sketch keeps the current tick in one atomic
// word, refreshed by one goroutine per Sketch at each tick boundary, so an
// Observe pays an atomic load for the time instead of a time.Now call.
// [Sketch.Close] stops it, and so does the garbage collector. A
// [ManualClock], or the explicit-time forms [Sketch.ObserveN] and
// [Sketch.EstimateAt], make replays and tests exact. No caller can move a
// Sketch's time backwards.
package epochsketch
