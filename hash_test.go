package epochsketch_test

import (
	"encoding/binary"
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

// sipHashRef is SipHash-c-d as the reference implementation writes it: a
// loop of c rounds per 8-byte word, the last 0 to 7 bytes gathered one by
// one under the length byte, d finalization rounds. The fast sipHash13 must
// match it word for word.
func sipHashRef(p []byte, k0, k1 uint64, c, d int) uint64 {
	v := [4]uint64{k0 ^ 0x736f6d6570736575, k1 ^ 0x646f72616e646f6d, k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573}
	round := func() {
		v[0] += v[1]
		v[1] = bits.RotateLeft64(v[1], 13) ^ v[0]
		v[0] = bits.RotateLeft64(v[0], 32)
		v[2] += v[3]
		v[3] = bits.RotateLeft64(v[3], 16) ^ v[2]
		v[0] += v[3]
		v[3] = bits.RotateLeft64(v[3], 21) ^ v[0]
		v[2] += v[1]
		v[1] = bits.RotateLeft64(v[1], 17) ^ v[2]
		v[2] = bits.RotateLeft64(v[2], 32)
	}
	compress := func(m uint64, rounds int) {
		v[3] ^= m
		for range rounds {
			round()
		}
		v[0] ^= m
	}
	n := len(p)
	for ; len(p) >= 8; p = p[8:] {
		compress(binary.LittleEndian.Uint64(p), c)
	}
	last := uint64(n) << 56
	for i, b := range p {
		last |= uint64(b) << (8 * i)
	}
	compress(last, c)
	v[2] ^= 0xff
	for range d {
		round()
	}
	return v[0] ^ v[1] ^ v[2] ^ v[3]
}

// sip13Golden is SipHash-1-3 under key 00..0f of the message 00 01 02 ...
// of every length 0 to 64, as the sketch computed it before its rounds
// were unrolled: a SipHash sketch's snapshot stores its key, and a
// restored one must keep finding its keys in the same buckets.
var sip13Golden = []uint64{
	0xabac0158050fc4dc, 0xc9f49bf37d57ca93, 0x82cb9b024dc7d44d, 0x8bf80ab8e7ddf7fb,
	0xcf75576088d38328, 0xdef9d52f49533b67, 0xc50d2b50c59f22a7, 0xd3927d989bb11140,
	0x369095118d299a8e, 0x25a48eb36c063de4, 0x79de85ee92ff097f, 0x70c118c1f94dc352,
	0x78a384b157b4d9a2, 0x306f760c1229ffa7, 0x605aa111c0f95d34, 0xd320d86d2a519956,
	0xcc4fdd1a7d908b66, 0x9cf2689063dbd80c, 0x8ffc389cb473e63e, 0xf21f9de58d297d1c,
	0xc0dc2f46a6cce040, 0xb992abfe2b45f844, 0x7ffe7b9ba320872e, 0x525a0e7fdae6c123,
	0xf464aeb267349c8c, 0x45cd5928705b0979, 0x3a3e35e3ca9913a5, 0xa91dc74e4ade3b35,
	0xfb0bed02ef6cd00d, 0x88d93cb44ab1e1f4, 0x540f11d643c5e663, 0x2370dd1f8c21d1bc,
	0x81157b6c16a7b60d, 0x4d54b9e57a8ff9bf, 0x759f12781f2a753e, 0xcea1a3bebf186b91,
	0x2cf508d3ada26206, 0xb6101c2da3c33057, 0xb3f47496ae3a36a1, 0x626b57547b108392,
	0xc1d2363299e41531, 0x667cc1923f1ad944, 0x65704ffec8138825, 0x24f280d1c28949a6,
	0xc2ca1cedfaf8876b, 0xc2164bfc9f042196, 0xa16e9c9368b1d623, 0x49fb169c8b5114fd,
	0x9f3143f8df074c46, 0xc6fdaf2412cc86b3, 0x7eaf49d10a52098f, 0x1cf313559d292f9a,
	0xc44a30dda2f41f12, 0x36fae98943a71ed0, 0x318fb34c73f0bce6, 0xa27abf3670a7e980,
	0xb4bcc0db243c6d75, 0x23f8d852fdb71513, 0x8f035f4da67d8a08, 0xd89cd0e5b7e8f148,
	0xf6f4e6bcf7a644ee, 0xaec59ad80f1837f2, 0xc3b2f6154b6694e0, 0x9d199062b7bbb3a8,
	0xf17997ec4b4a6065,
}

func TestSipHashVectors(t *testing.T) {
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	for i, want := range sip24Vectors {
		if got := sipHashRef(seq(i), k0, k1, 2, 4); got != want {
			t.Errorf("reference SipHash-2-4 len %d = %#016x, want %#016x", i, got, want)
		}
	}
	for i, want := range sip13Vectors {
		if got := sipHashRef(seq(i), 0, 0, 1, 3); got != want {
			t.Errorf("reference SipHash-1-3 len %d = %#016x, want %#016x", i, got, want)
		}
		if got := epochsketch.SipHash13(seq(i), 0, 0); got != want {
			t.Errorf("SipHash-1-3 len %d = %#016x, want %#016x", i, got, want)
		}
		if got := epochsketch.SipHash13String(string(seq(i)), 0, 0); got != want {
			t.Errorf("SipHash-1-3 string len %d = %#016x, want %#016x", i, got, want)
		}
	}
	if len(sip13Golden) != 65 {
		t.Fatalf("%d golden values, want 65 (lengths 0 to 64)", len(sip13Golden))
	}
	for i, want := range sip13Golden {
		p := seq(i)
		for _, got := range []struct {
			form string
			h    uint64
		}{
			{"reference", sipHashRef(p, k0, k1, 1, 3)},
			{"bytes", epochsketch.SipHash13(p, k0, k1)},
			{"string", epochsketch.SipHash13String(string(p), k0, k1)},
		} {
			if got.h != want {
				t.Errorf("SipHash-1-3 (%s) len %d = %#016x, want %#016x", got.form, i, got.h, want)
			}
		}
	}
}

// TestSipHash13MatchesReference: random keys and messages of every length
// from 0 to 64, each also at an offset inside a larger buffer (so that no
// load reads before or past the slice), in both forms.
func TestSipHash13MatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 1))
	buf := make([]byte, 80)
	for range 50 {
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		k0, k1 := r.Uint64(), r.Uint64()
		for n := 0; n <= 64; n++ {
			for _, off := range []int{0, 3, 80 - n} {
				p := buf[off : off+n : off+n]
				want := sipHashRef(p, k0, k1, 1, 3)
				if got := epochsketch.SipHash13(p, k0, k1); got != want {
					t.Fatalf("bytes len %d off %d: %#016x, want %#016x", n, off, got, want)
				}
				if got := epochsketch.SipHash13String(string(p), k0, k1); got != want {
					t.Fatalf("string len %d off %d: %#016x, want %#016x", n, off, got, want)
				}
			}
		}
	}
}

// FuzzSipHash13 checks the fast SipHash-1-3 against the reference on any
// message and key.
func FuzzSipHash13(f *testing.F) {
	f.Add([]byte("hot:0"), uint64(1), uint64(2))
	f.Add(seq(64), uint64(0x0706050403020100), uint64(0x0f0e0d0c0b0a0908))
	f.Fuzz(func(t *testing.T, p []byte, k0, k1 uint64) {
		want := sipHashRef(p, k0, k1, 1, 3)
		if got := epochsketch.SipHash13(p, k0, k1); got != want {
			t.Fatalf("bytes %x: %#016x, want %#016x", p, got, want)
		}
		if got := epochsketch.SipHash13String(string(p), k0, k1); got != want {
			t.Fatalf("string %x: %#016x, want %#016x", p, got, want)
		}
	})
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
	skipUnderRace(t)
	const trials, bound = 4000, 0.05
	mseed := epochsketch.New(epochsketch.Config{NumBuckets: 1, Clock: epochsketch.NewManualClock(t0)})
	hashes := []struct {
		name string
		fn   func([]byte) uint64
	}{
		{"maphash", mseed.HashBytes},
		{"wyhash", func(p []byte) uint64 { return epochsketch.Wyhash(p, 0x1234) }},
		{"siphash13", func(p []byte) uint64 { return epochsketch.SipHash13(p, 0x1234, 0x5678) }},
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
