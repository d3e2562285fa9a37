package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Schedule is a chip lottery: the probability that one challenge chips a
// victim whose effective count is c.
type Schedule struct {
	Name string
	Note string
	P    func(c uint32) float64
}

// Schedules are the candidates of THEORY.md section 1. M-schedules draw k
// mask bits, P = 2^-k(c), so they need no float math on the hot path;
// HeavyKeeper draws against b^-C.
var Schedules = []Schedule{
	{"M1", "k = C: the plain example (3 counts: 1 in 8)", func(c uint32) float64 { return math.Ldexp(1, -int(min(c, 1100))) }},
	{"M2", "k = floor(log2(C+1)): P ≈ 1/(C+1)", func(c uint32) float64 { return math.Ldexp(1, -int(math.Floor(math.Log2(float64(c)+1)))) }},
	{"M3", "k = floor(C/9): 2^(1/9) = 1.080, HeavyKeeper's base in steps (LotteryChip's schedule)", func(c uint32) float64 { return math.Ldexp(1, -int(c/9)) }},
	{"M4", "k = floor(C/4): base 1.19", func(c uint32) float64 { return math.Ldexp(1, -int(c/4)) }},
	{"HK", "HeavyKeeper, exact 1.08^-C", func(c uint32) float64 { return math.Pow(1.08, -float64(c)) }},
	{"HK-C++", "HeavyKeeper as the authors' C++ computes it: 1/floor(1.08^C)", func(c uint32) float64 { return 1 / math.Floor(math.Pow(1.08, float64(c))) }},
}

// DuelResult is one duel: how long a challenger waited for a slot.
type DuelResult struct {
	Arrivals int // challenger arrivals until it held a slot
	Ticks    int // ticks until then
}

// Duel simulates a challenger against a full bucket with a schedule, exactly as the library
// resolves a full bucket: 8 occupants inserted n times at tick 0, then idle
// (decaying by half per tick); one challenger arriving r times per tick from
// tick 0. Each arrival challenges the weakest occupant; a win takes one count
// at the occupant's current decayed value, and a win on a count of 1 (or a
// decayed-to-zero occupant) admits the challenger. Capped at maxTicks.
func Duel(s Schedule, n, r, maxTicks int, seed uint64) DuelResult {
	rng := rand.New(rand.NewPCG(seed, 0xd0e1))
	var count [8]uint64 // stored counts, all written at tick 0
	for i := range count {
		count[i] = uint64(n)
	}
	arrivals := 0
	for tick := 0; tick < maxTicks; tick++ {
		for range r {
			arrivals++
			// The weakest occupant at this tick (the first on a tie).
			w, we := 0, uint64(math.MaxUint64)
			for i, c := range count {
				if e := c >> min(tick, 63); e < we {
					w, we = i, e
				}
			}
			if we == 0 {
				return DuelResult{arrivals, tick}
			}
			if rng.Float64() < s.P(uint32(min(we, 1<<24-1))) {
				if we == 1 {
					return DuelResult{arrivals, tick}
				}
				count[w] -= 1 << min(tick, 63) // one count at this age, epoch kept
			}
		}
	}
	return DuelResult{arrivals, maxTicks}
}

// ProtectionTable renders P(chip | C) per schedule for the counts in cs.
func ProtectionTable(cs []uint32) [][]string {
	head := []string{"schedule"}
	for _, c := range cs {
		head = append(head, fmt.Sprintf("C=%d", c))
	}
	rows := [][]string{head}
	for _, s := range Schedules {
		row := []string{s.Name}
		for _, c := range cs {
			row = append(row, fmtP(s.P(c)))
		}
		rows = append(rows, row)
	}
	return rows
}

func fmtP(p float64) string {
	switch {
	case p == 0 || p < 1e-300:
		return "0"
	case p >= 0.01:
		return fmt.Sprintf("%.3g", p)
	default:
		return fmt.Sprintf("%.1e", p)
	}
}
