package epochsketch

import (
	"fmt"
	"hash/maphash"
	"math/bits"
)

// HashKind selects the key hash (docs/DESIGN.md, Hashes). Every kind is seeded per
// instance; the hash must pass avalanche tests because the chip lottery
// consumes its bits.
type HashKind uint8

const (
	// HashWyhash is a seedable multiply-mix hash of the wyhash construction,
	// of the same speed class as maphash, keyed per instance: a random key
	// with Seed 0, one derived from Config.Seed otherwise. The key is saved
	// in snapshots, so that the default sketch can be saved and restored.
	// It is the zero value, so the default.
	HashWyhash HashKind = iota
	// HashMaphash is the standard library's hash/maphash with a random seed:
	// AES-based on amd64 and arm64, fast and avalanche-clean. Its seed
	// cannot be exported, so a maphash sketch cannot be saved
	// (ErrMaphashSnapshot), and it cannot be seeded from Config.Seed.
	HashMaphash
	// HashSipHash13 is SipHash-1-3, a keyed hash: an adversary who knows the
	// algorithm but not the key cannot engineer bucket floods or bias the
	// lottery. For attacker-chosen keys (public rate limits, DDoS filters).
	HashSipHash13
)

var hashNames = [...]string{"wyhash", "maphash", "siphash13"}

// hashCodes are the kinds' codes in a snapshot header: fixed when the format
// was, so that a renumbering of HashKind never misreads a saved file.
var hashCodes = [...]byte{HashWyhash: 2, HashMaphash: 1, HashSipHash13: 3}

// hashOfCode returns the kind a snapshot header's code names, and false for
// a code no kind has.
func hashOfCode(c byte) (HashKind, bool) {
	for k, code := range hashCodes {
		if code == c {
			return HashKind(k), true
		}
	}
	return 0, false
}

// String returns the kind's name, as ParseHashKind accepts it.
func (k HashKind) String() string {
	if int(k) < len(hashNames) {
		return hashNames[k]
	}
	return fmt.Sprintf("HashKind(%d)", uint8(k))
}

// ParseHashKind returns the kind named s (as String writes it).
func ParseHashKind(s string) (HashKind, error) {
	for i, n := range hashNames {
		if n == s {
			return HashKind(i), nil
		}
	}
	return 0, fmt.Errorf("epochsketch: unknown hash %q: want one of wyhash, maphash, siphash13", s)
}

// hasher is the resolved hash of one Sketch. It is a value, copied into the
// Sketch, so the hot path reads it without an indirection.
type hasher struct {
	kind   HashKind
	mseed  maphash.Seed
	k0, k1 uint64 // wyhash seed in k0; SipHash key in k0, k1
	sip    sipKey // newSipKey(k0, k1)
}

// setKey sets the wyhash seed and SipHash key (k0, k1).
func (h *hasher) setKey(k0, k1 uint64) {
	h.k0, h.k1, h.sip = k0, k1, newSipKey(k0, k1)
}

func (h *hasher) str(s string) uint64 {
	switch h.kind {
	case HashMaphash:
		return maphash.String(h.mseed, s)
	case HashWyhash:
		return wyhash(s, h.k0)
	default:
		return sipHash13(s, h.sip)
	}
}

func (h *hasher) bytes(b []byte) uint64 {
	switch h.kind {
	case HashMaphash:
		return maphash.Bytes(h.mseed, b)
	case HashWyhash:
		return wyhash(b, h.k0)
	default:
		return sipHash13(b, h.sip)
	}
}

// key is what the generic hashes read: both forms index bytes the same way, so
// Observe(s) and ObserveBytes([]byte(s)) hash identically without converting.
type key interface{ ~string | ~[]byte }

// le64 and le32 slice first, so that the compiler checks the bounds once
// and reads the bytes as one load.
func le64[K key](p K, i int) uint64 {
	b := p[i : i+8]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func le32[K key](p K, i int) uint64 {
	b := p[i : i+4]
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24
}

// wyhash constants: the published wyhash secret.
const (
	wyp0 = 0xa0761d6478bd642f
	wyp1 = 0xe7037ed1a0b428db
	wyp2 = 0x8ebc6af09c88c6e3
	wyp3 = 0x589965cc75374cc3
)

func wymix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// wyhash follows the wyhash construction (128-bit multiply-fold over 16-byte
// lanes, three lanes for long inputs). It is not promised to be bit-compatible
// with any wyhash release; its quality is checked by the avalanche test.
func wyhash[K key](p K, seed uint64) uint64 {
	n := len(p)
	seed ^= wymix(seed^wyp0, wyp1)
	var a, b uint64
	switch {
	case n <= 16:
		if n >= 4 {
			q := (n >> 3) << 2
			a = le32(p, 0)<<32 | le32(p, q)
			b = le32(p, n-4)<<32 | le32(p, n-4-q)
		} else if n > 0 {
			a = uint64(p[0])<<16 | uint64(p[n>>1])<<8 | uint64(p[n-1])
		}
	default:
		i, o := n, 0
		if i > 48 {
			s1, s2 := seed, seed
			for i > 48 {
				seed = wymix(le64(p, o)^wyp1, le64(p, o+8)^seed)
				s1 = wymix(le64(p, o+16)^wyp2, le64(p, o+24)^s1)
				s2 = wymix(le64(p, o+32)^wyp3, le64(p, o+40)^s2)
				o += 48
				i -= 48
			}
			seed ^= s1 ^ s2
		}
		for i > 16 {
			seed = wymix(le64(p, o)^wyp1, le64(p, o+8)^seed)
			o += 16
			i -= 16
		}
		a = le64(p, o+i-16)
		b = le64(p, o+i-8)
	}
	a ^= wyp1
	b ^= seed
	hi, lo := bits.Mul64(a, b)
	return wymix(lo^wyp0^uint64(n), hi^wyp1)
}

// sipKey is a SipHash-1-3 key as the hash starts from it, computed once per
// key (newSipKey): the initialized state, with the first quarter of the
// first round, which reads only the key, already done (v0 and v1 after it;
// v2 and v3 as initialized).
type sipKey struct{ v0, v1, v2, v3 uint64 }

func newSipKey(k0, k1 uint64) sipKey {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13) ^ v0
	return sipKey{bits.RotateLeft64(v0, 32), v1, k0 ^ 0x6c7967656e657261, k1 ^ 0x7465646279746573}
}

// sipHash13 is SipHash-1-3 (one compression round, three finalization
// rounds) with key k, checked word for word against a plain reference and
// the reference implementation's vectors in hash_test.go. What reads only
// the key is done once (sipKey), the rounds are written out, not looped
// over a count, and the last 0 to 7 bytes are read in one or two loads
// (three byte loads for a key of 1 to 3 bytes), all in one function so
// that the state stays in registers (docs/LIMITERS.md has the cost).
func sipHash13[K key](p K, k sipKey) uint64 {
	// The first word: a key shorter than 8 bytes is its only one, the
	// length's low byte on top and its bytes below, read in two 4-byte
	// loads that overlap for 4 to 7 bytes (a shared byte lands on the same
	// bits in both, so OR keeps it), three byte loads for 1 to 3.
	n := len(p)
	var m uint64
	switch {
	case n >= 8:
		m = le64(p, 0)
	case n >= 4:
		m = uint64(n)<<56 | le32(p, 0) | le32(p, n-4)<<(8*(n-4)&63)
	case n > 0:
		m = uint64(n)<<56 | uint64(p[0]) | uint64(p[n>>1])<<(8*(n>>1)&63) | uint64(p[n-1])<<(8*(n-1)&63)
	default:
		m = 0
	}
	// The first round, from its second quarter (sipKey did the first).
	v3 := k.v3 ^ m
	v2 := k.v2 + v3
	v3 = bits.RotateLeft64(v3, 16) ^ v2
	v0 := k.v0 + v3
	v3 = bits.RotateLeft64(v3, 21) ^ v0
	v2 += k.v1
	v1 := bits.RotateLeft64(k.v1, 17) ^ v2
	v2 = bits.RotateLeft64(v2, 32)
	v0 ^= m
	if n >= 8 {
		o := 8
		for ; n-o >= 8; o += 8 {
			m = le64(p, o)
			v3 ^= m
			v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
			v0 ^= m
		}
		// The last word: the length's low byte on top, the last n-o bytes
		// below, which are the top of the key's last 8 bytes: one load,
		// shifted down (by 64 when n-o is 0, in two steps so that the
		// shift is never taken mod 64).
		m = uint64(n)<<56 | le64(p, n-8)>>8>>(8*(7-(n-o))&63)
		v3 ^= m
		v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
		v0 ^= m
	}
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// splitmix64 expands a seed into independent words (key material, salts).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
