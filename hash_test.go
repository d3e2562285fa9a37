package epochsketch_test

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/epochsketch/epochsketch"
)

// SipHash-2-4 vectors of the reference implementation (key 00..0f, message
// 00 01 02 ... of length i): they check the shared compression code.
var sip24Vectors = []uint64{
	0x726fdb47dd0e0e31, 0x74f839c593dc67fd, 0x0d6c8009d9a94f5a, 0x85676696d7fb7e2d,
	0xcf2794e0277187b7, 0x18765564cd99a68d, 0xcbc9466e58fee3ce, 0xab0200f58b01d137,
	0x93f5f5799a932462, 0x9e0082df0ba9e4b0, 0x7a5dbbc594ddb9f3, 0xf4b32f46226bada7,
	0x751e8fbc860ee5fb, 0x14ea5627c0843d90, 0xf723ca908e7af2ee, 0xa129ca6149be45e5,
	0x3f2acc7f57c29bdb, 0x699ae9f52cbe4794, 0x4bc1b3f0968dd39c, 0xbb6dc91da77961bd,
}

// SipHash-1-3 vectors of the reference implementation (veorq/SipHash with
// cROUNDS=1, dROUNDS=3), as published in OCaml's test suite: all-zero key,
// message 00 01 02 ... of length i.
var sip13Vectors = []uint64{
	0xd1fba762150c532c, 0x68a914128e01e473, 0x010bac45c41e3669, 0x4d4c9a4a8ef6e0ad,
	0x7cc43f98813e4dbd, 0x5abe2169dff36275, 0xe3c25f87624f1cdb, 0x2f098ab0c751325a,
	0xead411e67ebe2eea, 0x75927f9d95124362, 0xaf9f77a65ab51a1d, 0xfe64ce8b6617fcff,
	0xa6baf4fb0f9fe1c2, 0xa0cf3211850f8e0d, 0x7f86049379fbfe67, 0xf30eb725bb91c9ea,
	0x8972188433a5c5b7, 0x4883c49a2c009c1d, 0xadc2c0b63044067d, 0x091f4a3329f87d19,
	0x639e355ae68c0100, 0xb17bef2cb5213239, 0xf8aeb1066236ccfe, 0x37332b1389daa4ff,
	0x31185a47af932f3a, 0xebf352e82ae23e2f,
}

func seq(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

func TestSipHashVectors(t *testing.T) {
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	for i, want := range sip24Vectors {
		if got := epochsketch.SipHash(seq(i), k0, k1, 2, 4); got != want {
			t.Errorf("SipHash-2-4 len %d = %#016x, want %#016x", i, got, want)
		}
	}
	for i, want := range sip13Vectors {
		if got := epochsketch.SipHash(seq(i), 0, 0, 1, 3); got != want {
			t.Errorf("SipHash-1-3 len %d = %#016x, want %#016x", i, got, want)
		}
		if got := epochsketch.SipHash13String(string(seq(i)), 0, 0); got != want {
			t.Errorf("SipHash-1-3 string len %d = %#016x, want %#016x", i, got, want)
		}
	}
}

// Observe(s) and ObserveBytes([]byte(s)) must be one key space for every hash.
func TestHashStringBytesAgree(t *testing.T) {
	for _, kind := range []epochsketch.HashKind{epochsketch.HashMaphash, epochsketch.HashWyhash, epochsketch.HashSipHash13} {
		t.Run(kind.String(), func(t *testing.T) {
			cfg := epochsketch.Config{NumBuckets: 16, Hash: kind, Clock: epochsketch.NewManualClock(t0)}
			if kind != epochsketch.HashMaphash {
				cfg.Seed = 7
			}
			sk := epochsketch.New(cfg)
			for n := 0; n < 200; n++ {
				k := seq(n)
				if a, b := sk.HashString(string(k)), sk.HashBytes(k); a != b {
					t.Fatalf("len %d: string hash %#x != bytes hash %#x", n, a, b)
				}
			}
		})
	}
}

// Seeds matter: one seed reproduces, two seeds differ.
func TestHashSeeds(t *testing.T) {
	for _, kind := range []epochsketch.HashKind{epochsketch.HashWyhash, epochsketch.HashSipHash13} {
		a := epochsketch.New(epochsketch.Config{Hash: kind, Seed: 1, NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
		b := epochsketch.New(epochsketch.Config{Hash: kind, Seed: 1, NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
		c := epochsketch.New(epochsketch.Config{Hash: kind, Seed: 2, NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
		if a.HashString("k") != b.HashString("k") {
			t.Errorf("%v: same seed, different hashes", kind)
		}
		if a.HashString("k") == c.HashString("k") {
			t.Errorf("%v: different seeds, same hash", kind)
		}
	}
	x := epochsketch.New(epochsketch.Config{NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
	y := epochsketch.New(epochsketch.Config{NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
	if x.HashString("k") == y.HashString("k") {
		t.Errorf("two unseeded sketches hash alike: the per-instance seed is missing")
	}
}

// fnv1a is a hash the avalanche bar disqualifies (docs/DESIGN.md, Hashes); it lives only here, to show
// why.
func fnv1a(p []byte) uint64 {
	h := uint64(0xcbf29ce484222325)
	for _, c := range p {
		h ^= uint64(c)
		h *= 0x100000001b3
	}
	return h
}

// worstBias flips every input bit of random keys and returns the largest
// |P(output bit flips) - 1/2| over all (input bit, output bit) pairs.
func worstBias(hash func([]byte) uint64, keyLen, trials int, r *rand.Rand) float64 {
	flips := make([][64]int, keyLen*8)
	key := make([]byte, keyLen)
	for range trials {
		for i := range key {
			key[i] = byte(r.Uint32())
		}
		h0 := hash(key)
		for bit := 0; bit < keyLen*8; bit++ {
			key[bit/8] ^= 1 << (bit % 8)
			d := h0 ^ hash(key)
			key[bit/8] ^= 1 << (bit % 8)
			for d != 0 {
				o := bits.TrailingZeros64(d)
				flips[bit][o]++
				d &= d - 1
			}
		}
	}
	worst := 0.0
	for _, row := range flips {
		for _, n := range row {
			b := float64(n)/float64(trials) - 0.5
			worst = max(worst, b, -b)
		}
	}
	return worst
}

// TestAvalanche is the quality bar for the lottery's entropy (docs/DESIGN.md, Hashes):
// flipping any input bit flips every output bit with probability 1/2. With
// 4000 trials a fair bit's bias exceeds 0.05 with probability about 1e-10
// per pair, so the bound fails only a broken hash. FNV-1a fails it by a
// wide margin: its last byte never reaches the low output bits it sits
// below, which is why it is not offered.
func TestAvalanche(t *testing.T) {
	const trials, bound = 4000, 0.05
	mseed := epochsketch.New(epochsketch.Config{NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
	hashes := []struct {
		name string
		fn   func([]byte) uint64
	}{
		{"maphash", mseed.HashBytes},
		{"wyhash", func(p []byte) uint64 { return epochsketch.Wyhash(p, 0x1234) }},
		{"siphash13", func(p []byte) uint64 { return epochsketch.SipHash(p, 0x1234, 0x5678, 1, 3) }},
	}
	for _, keyLen := range []int{4, 8, 13, 24, 64} {
		for _, h := range hashes {
			t.Run(fmt.Sprintf("%s/len=%d", h.name, keyLen), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(keyLen), 1))
				if b := worstBias(h.fn, keyLen, trials, r); b > bound {
					t.Errorf("worst per-bit bias %.3f > %.2f", b, bound)
				}
			})
		}
		t.Run(fmt.Sprintf("fnv1a-disqualified/len=%d", keyLen), func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(keyLen), 1))
			if b := worstBias(fnv1a, keyLen, trials, r); b < 0.4 {
				t.Errorf("FNV-1a worst bias %.3f: expected a gross failure (>= 0.4)", b)
			}
		})
	}
}
