// Package engine is the browser simulator's state, apart from JavaScript: a
// Sketch on a ManualClock with a seeded lottery, the exact decayed count of
// each key for comparison, and the traffic patterns. The WebAssembly build
// (../wasm) wraps it for the page; tests run it natively.
package engine

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/epochsketch/epochsketch/internal/lab"

	"github.com/epochsketch/epochsketch"
)

// Origin is the simulator's time zero (2023-11-14T22:13:20Z). The tick is
// one second, so a slot's epoch field is Unix seconds mod 2^24.
var Origin = time.Unix(1_700_000_000, 0)

const (
	// Tick is the simulator's tick.
	Tick = time.Second
	// WrapTicks is one whole timestamp wrap: 2^24 ticks.
	WrapTicks = 1 << 24

	maxExact    = 1 << 18 // keys whose exact count is kept, at most
	zipfKeys    = 1000
	zipfExp     = 1.1
	attackTries = 1 << 16
)

// Patterns are the traffic patterns NextKey draws from.
var Patterns = []string{"zipf", "mice", "elephant", "attack"}

type exact struct {
	c uint64
	t int64
}

// Sim is one simulation. It is not safe for concurrent use.
type Sim struct {
	Sketch *epochsketch.Sketch
	Clock  *epochsketch.ManualClock
	ticks  int64
	rng    *rand.Rand
	zipf   *rand.Zipf
	mice   int
	attack int
	exact  map[string]exact
}

// Config is the sketch a simulation runs; the lottery is not part of it (New
// applies it).
func Config(seed uint64, buckets int, twoChoice bool) (epochsketch.Config, error) {
	cfg := epochsketch.Config{NumBuckets: buckets, TickDuration: Tick, Seed: seed, TwoChoice: twoChoice}
	if seed == 0 {
		return cfg, fmt.Errorf("seed 0: the simulator needs a seed from 1 to 2^64-1, so that runs repeat")
	}
	cfg.Clock = epochsketch.NewManualClock(Origin)
	return cfg, cfg.Validate()
}

// New starts a simulation at Origin, with lottery "heavykeeper" (the
// library's) or "chip" (the one that lost THEORY.md section 1's selection
// test, which the simulator keeps to show why).
func New(seed uint64, buckets int, lottery string, twoChoice bool) (*Sim, error) {
	cfg, err := Config(seed, buckets, twoChoice)
	if err != nil {
		return nil, err
	}
	sk := epochsketch.New(cfg)
	switch lottery {
	case "", "heavykeeper":
	case "chip":
		lab.UseChip(sk)
	default:
		return nil, fmt.Errorf("unknown lottery %q: want heavykeeper or chip", lottery)
	}
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	return &Sim{
		Sketch: sk,
		Clock:  cfg.Clock.(*epochsketch.ManualClock),
		rng:    r,
		zipf:   rand.NewZipf(r, zipfExp, 1, zipfKeys-1),
		exact:  make(map[string]exact),
	}, nil
}

// Now is the current tick (Unix seconds).
func (s *Sim) Now() int64 { return Origin.Unix() + s.ticks }

// Locate returns where key lives in the simulation's sketch: its bucket, its
// second candidate bucket with TwoChoice (else -1), and its fingerprint.
func (s *Sim) Locate(key string) (bucket, second int, tag uint16) { return lab.Locate(s.Sketch, key) }

// Slots returns the 8 slot words of bucket i.
func (s *Sim) Slots(i int) [8]uint64 { return lab.Slots(s.Sketch, i) }

// Ticks is the number of ticks since New.
func (s *Sim) Ticks() int64 { return s.ticks }

// Advance moves the clock n ticks forward.
func (s *Sim) Advance(n int64) {
	s.ticks += n
	s.Clock.Advance(time.Duration(n) * Tick)
}

// Observe observes key in the sketch and in the exact count.
func (s *Sim) Observe(key string) (estimate uint32, first bool) {
	estimate, first = s.Sketch.Observe(key)
	if _, ok := s.exact[key]; ok || len(s.exact) < maxExact {
		s.exact[key] = exact{c: s.Exact(key) + 1, t: s.Now()}
	}
	return estimate, first
}

// Exact is the count key would read in an unbounded table with the same rule
// (c >> age, then +1 per occurrence): no collisions, no evictions, no
// saturation. Keys first seen after 2^18 distinct keys read 0.
func (s *Sim) Exact(key string) uint64 {
	e, ok := s.exact[key]
	if !ok {
		return 0
	}
	age := s.Now() - e.t
	if age >= 64 {
		return 0
	}
	return e.c >> age
}

// NextKey draws the next key of a traffic pattern (see Patterns). An attack
// aims at bucket watched with keys found by trying the seeded hash, as an
// attacker who knows the seed can (THEORY.md section 6).
func (s *Sim) NextKey(pattern string, watched int) (string, error) {
	switch pattern {
	case "zipf":
		return "user-" + strconv.FormatUint(s.zipf.Uint64(), 10), nil
	case "mice":
		s.mice++
		return "mouse-" + strconv.Itoa(s.mice), nil
	case "elephant":
		if s.rng.IntN(2) == 0 {
			return "elephant", nil
		}
		return "user-" + strconv.FormatUint(s.zipf.Uint64(), 10), nil
	case "attack":
		if watched < 0 || watched >= s.Sketch.NumBuckets() {
			return "", fmt.Errorf("attack on bucket %d: the table has buckets 0 to %d", watched, s.Sketch.NumBuckets()-1)
		}
		for range attackTries {
			s.attack++
			k := "atk-" + strconv.Itoa(s.attack)
			if b, b2, _ := s.Locate(k); b == watched || b2 == watched {
				return k, nil
			}
		}
		return "", fmt.Errorf("no key for bucket %d in %d tries", watched, attackTries)
	}
	return "", fmt.Errorf("unknown traffic pattern %q: want one of %v", pattern, Patterns)
}
