// Package refmodel is the reference model of EpochSketch: a single-threaded,
// deliberately plain transcription of Observe as docs/DESIGN.md describes
// it. It has no atomics, no packing tricks and no shortcuts; the fuzz test
// demands that the fast code return the same answers and store the same
// slot words as this model.
package refmodel

import "math"

// Constants of the slot layout (docs/DESIGN.md, Slots), restated rather than imported.
const (
	MaxCount = 1<<24 - 1
	Wrap     = 1 << 24 // epochs are ticks mod 2^24
	Slots    = 8       // slots per bucket
	ChipStep = 9       // schedule M3: one more mask bit every 9 counts
)

// Slot is one decoded slot. The zero Slot is empty.
type Slot struct {
	Tag   uint16
	Epoch uint32
	Count uint32
}

// Word encodes the slot as the library stores it: tag 63..48, epoch 47..24,
// count 23..0.
func (s Slot) Word() uint64 {
	return uint64(s.Tag)<<48 | uint64(s.Epoch)<<24 | uint64(s.Count)
}

func (s Slot) empty() bool { return s == Slot{} }

// age is (now - epoch) mod 2^24.
func (s Slot) age(now uint32) uint32 { return (now + Wrap - s.Epoch) % Wrap }

// eff is count >> min(age, 63).
func (s Slot) eff(now uint32) uint32 {
	a := s.age(now)
	if a > 63 {
		a = 63
	}
	return s.Count >> a
}

// Counters indexes Stats.
const (
	CASExhausted = iota // never happens single-threaded; kept for shape
	Evictions
	Chips
	Scrubbed
	Lost
)

// Model is the whole table and the state the lottery and clock need.
type Model struct {
	B         [][Slots]Slot
	TwoChoice bool
	HeavyKeep bool   // HeavyKeeper-classic (the library's lottery) instead of the retired chip schedule
	SaltBase  uint64 // seeded lottery salt: splitmix64(SaltBase + n), n = 1, 2, ...
	saltN     uint64
	HW        int64 // highest tick used
	Stats     [5]uint64
}

// New returns an empty model of n buckets whose clock starts at tick.
func New(n int, tick int64) *Model {
	return &Model{B: make([][Slots]Slot, n), HW: tick}
}

func (m *Model) buckets(h uint64) []int {
	n := uint64(len(m.B))
	i := (h >> 32) * n >> 32
	out := []int{int(i)}
	if m.TwoChoice {
		h2 := (h ^ h>>29) * 0xbf58476d1ce4e5b9
		if j := (h2 >> 32) * n >> 32; j != i {
			out = append(out, int(j))
		}
	}
	return out
}

// slots lists pointers to the key's candidate slots in search order: with
// one bucket, from the key's home slot (hash bits 15..13) round to the slot
// before it; with TwoChoice, both buckets in slot order.
func (m *Model) slots(h uint64) []*Slot {
	var out []*Slot
	home := 0
	if !m.TwoChoice {
		home = int(h >> 13 & (Slots - 1))
	}
	for _, b := range m.buckets(h) {
		for k := range Slots {
			out = append(out, &m.B[b][(home+k)%Slots])
		}
	}
	return out
}

func (m *Model) clock(tick int64) uint32 {
	if tick > m.HW {
		m.HW = tick
	}
	return uint32(uint64(m.HW) % Wrap)
}

// Observe is Observe as docs/DESIGN.md describes it.
func (m *Model) Observe(h uint64, tick int64) (uint32, bool) { return m.ObserveN(h, tick, 1) }

// ObserveN is Observe with a weight w >= 1: the key's count grows by w; a
// claim stores w; a challenge draws the lottery once per unit of weight, at
// most 64 times, each win taking one count from the weakest slot, and the
// win that empties it claims it with the units not yet drawn.
func (m *Model) ObserveN(h uint64, tick int64, w uint32) (uint32, bool) {
	if w > MaxCount {
		w = MaxCount
	}
	now := m.clock(tick)
	tag := keyTag(h)
	slots := m.slots(h)

	// Scrub every other slot silent for 24 ticks or more (scrub-on-write),
	// unless (one bucket) the key's slot was written this tick already: that
	// write scrubbed, and no slot turns 24 ticks old within a tick.
	own, held := 0, (*Slot)(nil)
	for _, s := range slots {
		if !s.empty() && s.Tag == tag {
			own++
			held = s
		}
	}
	if m.TwoChoice || own != 1 || held.age(now) != 0 {
		for _, s := range slots {
			if !s.empty() && s.Tag != tag && s.age(now) >= 24 {
				*s = Slot{}
				m.Stats[Scrubbed]++
			}
		}
	}

	// Phase 1: the key's slot (the first holding its tag).
	for _, s := range slots {
		if !s.empty() && s.Tag == tag {
			e := s.eff(now)
			fold := s.age(now) > 0
			n := e + w
			if n > MaxCount {
				n = MaxCount
			}
			*s = Slot{tag, now, n}
			return n, fold
		}
	}

	// Phase 2: the first empty or decayed-to-zero slot, in search order, of
	// the less loaded bucket (the first bucket on a tie).
	var claim *Slot
	bestLive := math.MaxInt
	for b := 0; b*Slots < len(slots); b++ {
		var first *Slot
		live := 0
		for _, s := range slots[b*Slots : (b+1)*Slots] {
			if s.empty() || s.eff(now) == 0 {
				if first == nil {
					first = s
				}
			} else {
				live++
			}
		}
		if first != nil && live < bestLive {
			claim, bestLive = first, live
		}
	}
	if claim != nil {
		*claim = Slot{tag, now, w}
		return w, true
	}

	// Phase 3: challenge the weakest slot (the first in search order on a tie).
	victim := slots[0]
	for _, s := range slots {
		if s.eff(now) < victim.eff(now) {
			victim = s
		}
	}
	e := victim.eff(now)
	var wins, used uint32
	for used < w && used < 64 && wins < e {
		used++
		cur := *victim
		cur.Count -= wins << victim.age(now) // the victim as the previous wins left it
		if m.wins(h, cur.Word(), e-wins) {
			wins++
		}
	}
	if wins == 0 {
		m.Stats[Lost]++
		return w, true
	}
	if wins == e {
		*victim = Slot{tag, now, w - used + 1}
		m.Stats[Evictions]++
		return w - used + 1, true
	}
	// Take wins counts at the victim's age: subtract wins·2^age, keep its epoch.
	victim.Count -= wins << victim.age(now)
	m.Stats[Chips] += uint64(wins)
	m.Stats[Lost]++
	return w, true
}

// draw returns the next salt of the seeded sequence.
func (m *Model) draw() uint64 {
	m.saltN++
	return Splitmix64(m.SaltBase + m.saltN)
}

func (m *Model) wins(h, victim uint64, eff uint32) bool {
	if m.HeavyKeep {
		salt := m.draw()
		// P = 1.08^-eff, as a threshold on a uniform 64-bit draw.
		p := math.Ldexp(math.Pow(1.08, -float64(eff)), 64)
		if p >= math.MaxUint64 {
			return salt < math.MaxUint64
		}
		return salt < uint64(p)
	}
	// Schedule M3: P = 2^-floor(eff/9). A mask of 0 bits always wins and
	// takes no draw; one of 64 bits or more never wins.
	k := eff / ChipStep
	if k == 0 {
		return true
	}
	if k >= 64 {
		return false
	}
	mixed := (h ^ victim ^ m.draw()) * 0x9e3779b97f4a7c15
	return mixed>>(64-k) == 0
}

// Estimate reads the key's slot without writing anything.
func (m *Model) Estimate(h uint64, tick int64) uint32 {
	t := m.HW
	if tick > t {
		t = tick
	}
	now := uint32(uint64(t) % Wrap)
	tag := keyTag(h)
	for _, s := range m.slots(h) {
		if !s.empty() && s.Tag == tag {
			return s.eff(now)
		}
	}
	return 0
}

// keyTag is hash bits 31..16; tag 0 is read as 1, so that no key's tag
// matches an empty slot.
func keyTag(h uint64) uint16 {
	if t := uint16(h >> 16); t != 0 {
		return t
	}
	return 1
}

// Splitmix64 is the seeded salt generator.
func Splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}
