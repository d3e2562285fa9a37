package epochsketch

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"unsafe"
)

// chipStep is schedule M3's step: the chip mask widens by one bit every 9
// counts, so P(chip) = 2^-floor(C/9) ≈ 1.08^-C, HeavyKeeper's decay base
// (2^(1/9) = 1.0801), in steps. A victim of 8 counts or fewer is chipped on
// every challenge; one of 576 or more never is.
const chipStep = 9

// hkBase is HeavyKeeper's decay base b (Gong et al., ATC 2018).
const hkBase = 1.08

// hkThreshold[c] is floor(2^64 · 1.08^-c): a uniform draw below it happens
// with probability 1.08^-c. Counts past the table never decay (the
// probability is below 2^-64). Computed once, so no float math runs per call.
var hkThreshold = func() []uint64 {
	var t []uint64
	for c := 0; ; c++ {
		p := math.Ldexp(math.Pow(hkBase, -float64(c)), 64)
		if p >= math.MaxUint64 {
			t = append(t, math.MaxUint64)
			continue
		}
		if p < 1 {
			return t
		}
		t = append(t, uint64(p))
	}
}()

// saltState is the lottery's per-attempt entropy when Config.Seed is set: a
// counter on its own cache line, so single-threaded runs reproduce. Unseeded
// sketches use the runtime's per-thread generator instead and share nothing.
type saltState struct {
	saltFields
	_ [cacheLine - unsafe.Sizeof(saltFields{})%cacheLine]byte
}

type saltFields struct {
	n    atomic.Uint64
	base uint64
}

// salt returns fresh entropy for one draw. A failed draw changes nothing in
// the bucket, so a draw that depended on (key, victim word) alone could
// bounce one persistent challenger forever; the salt makes every attempt a
// new draw.
func (s *Sketch) salt() uint64 {
	if s.seeded != nil {
		return splitmix64(s.seeded.base + s.seeded.n.Add(1))
	}
	return rand.Uint64()
}

// maxDraws bounds the lottery draws of one weighted challenge: bounded work
// per call (docs/DESIGN.md, Observe).
const maxDraws = 64

// challenge runs one lottery draw per unit of weight wt, at most maxDraws,
// against the weakest slot (word victim at apparent age age, effective count
// eff >= 1): each win takes one count, so the next draw is against the word
// and count as they would be after it, exactly as wt calls of Observe would
// draw. It stops when the victim is empty. It returns the wins and the draws
// used.
//
// For a smooth sketch eff and wt are in external counts, and one count is sc
// of the victim's word (1 otherwise).
func (s *Sketch) challenge(h, victim uint64, age, eff, wt, sc uint32) (wins, used uint32) {
	for used < min(wt, maxDraws) && wins < eff {
		used++
		if s.chipWins(h, victim-uint64(wins*sc)<<age, eff-wins) {
			wins++
		}
	}
	return wins, used
}

// chipWins runs the lottery of challenger hash h against the weakest slot,
// whose word is victim and effective count eff (>= 1).
func (s *Sketch) chipWins(h, victim uint64, eff uint32) bool {
	if traceOn {
		return s.chipWinsTraced(h, victim, eff)
	}
	if s.lottery == lotteryHeavyKeeper {
		return int(eff) < len(hkThreshold) && s.salt() < hkThreshold[eff]
	}
	if eff < chipStep {
		return true // an empty mask: a sure chip needs no draw (a mouse flood's common case)
	}
	return chipDraw(h, victim, s.salt(), eff)
}

// chipDraw is schedule M3: win when the top floor(eff/9) bits of the mixed
// draw are zero. The multiply by an odd constant carries every input bit
// into the top bits.
func chipDraw(h, victim, salt uint64, eff uint32) bool {
	k := eff / chipStep
	if k == 0 {
		return true
	}
	if k >= 64 {
		return false
	}
	return ((h^victim^salt)*drawMix)>>(64-k) == 0
}

// drawMix spreads a lottery draw's input over all 64 bits before its top k
// bits are tested: 2^64 divided by the golden ratio (Fibonacci hashing).
const drawMix = 0x9e3779b97f4a7c15
