// Package engine decides SketchProxy's rate limits, wallets, bans and
// tarpit levels for every door: the HTTP middleware, the forward-auth check
// and Envoy's rate-limit service (and any later one). It is the only code
// of the module that holds a sketch. It imports neither net/http nor gRPC:
// a door finds the rules a request matches and its key under each, asks
// the engine, and translates the verdicts into its own protocol.
//
// A configuration compiles into an immutable Set (Compile); a reload
// compiles the new one, reusing the sketches whose tick and size it keeps,
// swaps it in, and retires the old (Retire). Deciding a request is
// Evaluate for each rule it matches, counting nothing; then, for an
// admitted request, CheckBudget and Charge for its wallets and Commit for
// its limits; RetryAll and Fields give Retry-After and the RateLimit and
// RateLimit-Policy field values (sketchproxy/README.md, How it is built).
package engine

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch"
)

// Options are what an Engine needs besides its rule sets.
type Options struct {
	// Clock drives the sketches and the waits (nil: the wall clock).
	Clock epochsketch.Clock
	// Seed makes the sketches' hashes and lotteries repeatable (0: random).
	Seed uint64
	// Fleet shares heavy keys' counts with other replicas (nil: none).
	Fleet Fleet
}

// Fleet is the count other replicas share, behind an interface so that the
// engine knows nothing of Redis.
type Fleet interface {
	// Estimate returns the fleet-wide estimate of the sketch key k, whose
	// estimate in this replica's sketch local is est (read just now); tick
	// and theta are its limit's. The fleet may keep local, to read k again
	// at its next round (it must copy k).
	Estimate(k []byte, local Local, tick time.Duration, theta, est uint32, now time.Time) uint32
	// WalletsClosed reports whether wallets fail closed right now (their
	// counts cannot be shared), and how long a refused client should wait.
	WalletsClosed() (bool, time.Duration)
}

// Local is one of this replica's sketches, as a Fleet reads it.
type Local interface {
	EstimateBytes(k []byte) uint32
}

// Engine decides requests against the Set a door gives it. It holds what
// outlives a reload: the meter of new keys, when keys were last marked new
// or banned, and the outcome counts by rule name. Safe for concurrent use.
type Engine struct {
	opts    Options
	started time.Time

	mu     sync.Mutex // Compile, Retire, SaveState: one at a time
	counts map[string]*Counts

	spike         spikeMeter
	restoredMeter atomic.Bool  // a state file restored the new-key meter
	lastNew       atomic.Int64 // when a key was last marked new (Unix ns; 0: never)
	lastBan       atomic.Int64 // when a key was last banned (Unix ns; 0: never)
}

// New returns an Engine.
func New(opts Options) *Engine {
	e := &Engine{opts: opts, counts: map[string]*Counts{}}
	e.started = e.Now()
	return e
}

// Now reads the engine's clock.
func (e *Engine) Now() time.Time {
	if e.opts.Clock != nil {
		return e.opts.Clock.Now()
	}
	return time.Now()
}

// Spec is a configuration as the engine needs it.
type Spec struct {
	Rules    []RuleSpec // matched by the HTTP doors
	RLSRules []RuleSpec // Envoy's descriptors' limits
	// Buckets and TwoChoice size every sketch of the rules.
	Buckets   int
	TwoChoice bool
	Tarpit    TarpitSpec
	NewKeys   NewKeysSpec
}

// RuleSpec is one rule (sketchproxy.Rule, without what the doors match on).
type RuleSpec struct {
	Name         string
	Limits       []LimitSpec
	Budget       *BudgetSpec
	Shadow       bool
	Tarpit       bool
	CountRefused bool // refused: count
	MaxInFlight  int
}

// LimitSpec is Requests per Per with bursts of Burst (LimitMath).
type LimitSpec struct {
	Name     string
	Requests float64
	Per      time.Duration
	Burst    float64
}

// BudgetSpec is a wallet: Units per Per, spent Unit at a time.
type BudgetSpec struct {
	Name          string
	Units         float64
	Per           time.Duration
	Unit          uint64
	Cost, Reserve uint64 // per request, in units
	FailOpen      bool
	// ReconcileHeader and ReconcileWait are the door's: where and how long
	// it waits for an upstream's report of what a request used (Settle).
	ReconcileHeader string
	ReconcileWait   time.Duration
}

// TarpitSpec is the tarpit's ladder, in levels (estimate / threshold).
type TarpitSpec struct {
	DelayAbove, DripAbove, RejectAbove, BanAbove float64
	BanFor, MaxDelay                             time.Duration
}

// NewKeysSpec is the new-key defence (sketchproxy.NewKeysConfig).
type NewKeysSpec struct {
	Disabled                                bool
	SpikeFactor, MinPerSecond, BudgetFactor float64
	Window, Remember, Warmup                time.Duration
}

// Set is one configuration's compiled rules and the sketches they use. It
// is immutable once compiled; Retire closes what a newer Set dropped.
type Set struct {
	Rules    []*Rule
	RLSRules []*Rule

	sketches map[sketchKey]*epochsketch.Sketch
	newKeys  *epochsketch.Sketch // keys first seen during a spike
	known    *epochsketch.Sketch // keys seen within about new_keys.remember
	bans     *epochsketch.Sketch // temporary bans
	banTick  time.Duration
	tarpit   TarpitSpec
	nk       NewKeysSpec
}

type sketchKey struct {
	tick    time.Duration
	buckets int
	two     bool
}

// Rule is a compiled rule.
type Rule struct {
	Name         string
	Shadow       bool
	Tarpit       bool
	CountRefused bool
	MaxInFlight  int
	Limits       []*Limit
	Budget       *Budget   // nil: no wallet
	InFlight     *CountMin // requests in flight per key; nil without MaxInFlight
	Counts       *Counts   // decisions by outcome, kept across reloads by name
	// Policy is the rule's items of the RateLimit-Policy field.
	Policy string
	top    *epochsketch.TopK
}

// Limit is a compiled limit: its threshold and tick, and its policy as the
// RateLimit fields name it.
type Limit struct {
	Name     string
	Policy   string // the RateLimit policy's name: rule-limit
	Quoted   string // the policy's name, quoted, for RateLimit items
	Item     string // its RateLimit-Policy item: "rule-limit";q=Q;w=W
	Q, W     int64  // the policy as whole requests Q per W seconds
	Requests float64
	Per      time.Duration
	Tick     time.Duration
	Theta    uint32 // the threshold, in counts: burst × Unit
	Unit     uint32 // counts per request (LimitMath: 2 for an odd burst)
	sk       *epochsketch.Sketch
}

// Budget is a compiled wallet.
type Budget struct {
	Spec  BudgetSpec
	Tick  time.Duration
	Theta uint32 // Units, in counts of Unit units (times Scale)
	Scale uint32 // counts per Unit units: 2 for an odd threshold, else 1
	// Cost and Reserve in counts (rounded up, times Scale).
	Cost, Reserve uint32
	Held          *CountMin // counts reserved by requests in flight, per key
	sk            *epochsketch.Sketch
}

// Counts counts a rule's decisions by outcome, real and shadow.
type Counts struct {
	n [NumOutcomes][2]atomic.Uint64
}

// Count counts one decision.
func (c *Counts) Count(o Outcome, shadow bool) {
	i := 0
	if shadow {
		i = 1
	}
	c.n[o][i].Add(1)
}

// Get returns the count of o.
func (c *Counts) Get(o Outcome, shadow bool) uint64 {
	i := 0
	if shadow {
		i = 1
	}
	return c.n[o][i].Load()
}

// Compile compiles spec into a Set. Sketches of prev (the running Set, or
// nil) whose tick and size spec keeps are shared, with their counts, and
// so are in-flight counts, reservations and top offenders of rules that
// keep their names. Nothing of prev changes: call Retire once the new Set
// is in use.
func (e *Engine) Compile(spec *Spec, prev *Set) (*Set, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &Set{sketches: map[sketchKey]*epochsketch.Sketch{}, tarpit: spec.Tarpit, nk: spec.NewKeys}
	sketch := func(tick time.Duration, buckets int) *epochsketch.Sketch {
		k := sketchKey{tick, buckets, spec.TwoChoice}
		if sk, ok := s.sketches[k]; ok {
			return sk
		}
		if prev != nil {
			if sk, ok := prev.sketches[k]; ok {
				s.sketches[k] = sk
				return sk
			}
		}
		sk := epochsketch.New(epochsketch.Config{
			NumBuckets: buckets, TickDuration: tick, Clock: e.opts.Clock,
			Seed: e.opts.Seed, TwoChoice: spec.TwoChoice,
			// Keys are chosen by clients: a keyed hash (THEORY.md section
			// 6), whose key a state file can keep.
			Hash: epochsketch.HashSipHash13,
		})
		s.sketches[k] = sk
		return sk
	}
	for j, rs := range [2][]RuleSpec{spec.Rules, spec.RLSRules} {
		for i := range rs {
			ru, err := e.compileRule(&rs[i], prev, spec.Buckets, sketch)
			if err != nil {
				for k, sk := range s.sketches {
					if prev == nil || prev.sketches[k] != sk {
						sk.Close()
					}
				}
				return nil, err
			}
			if j == 0 {
				s.Rules = append(s.Rules, ru)
			} else {
				s.RLSRules = append(s.RLSRules, ru)
			}
		}
	}
	// Side sketches: keys seen lately, new keys during a spike, and bans.
	s.known = sketch(spec.NewKeys.Remember, spec.Buckets)
	s.newKeys = sketch(spec.NewKeys.Window, 1<<12)
	s.banTick = max(time.Millisecond, spec.Tarpit.BanFor/4)
	s.bans = sketch(s.banTick, 1<<12)
	return s, nil
}

func (e *Engine) compileRule(rs *RuleSpec, prev *Set, buckets int, sketch func(time.Duration, int) *epochsketch.Sketch) (*Rule, error) {
	ru := &Rule{Name: rs.Name, Shadow: rs.Shadow, Tarpit: rs.Tarpit, CountRefused: rs.CountRefused, MaxInFlight: rs.MaxInFlight}
	for _, l := range rs.Limits {
		if l.Requests <= 0 || l.Per <= 0 || l.Burst <= 0 {
			return nil, fmt.Errorf("rule %q limit %q: %v per %v, burst %v: want all three positive", rs.Name, l.Name, l.Requests, l.Per, l.Burst)
		}
		// The tick follows the whole threshold the sketch counts to, so a
		// Burst that is not whole (2.5 per second: θ 3) keeps Requests per
		// Per exact.
		tick := TickFor(l.Requests, l.Per, float64(thresholdFor(l.Burst)))
		theta, unit := countsFor(l.Burst)
		lim := &Limit{
			Name: l.Name, Policy: rs.Name + "-" + l.Name, Tick: tick,
			Theta: theta, Unit: unit, Requests: l.Requests, Per: l.Per,
			sk: sketch(tick, buckets),
		}
		lim.Q, lim.W = WholePolicy(l.Requests, l.Per)
		lim.Quoted = strconv.Quote(lim.Policy)
		lim.Item = fmt.Sprintf("%s;q=%d;w=%d", lim.Quoted, lim.Q, lim.W)
		if ru.Policy != "" {
			ru.Policy += ", "
		}
		ru.Policy += lim.Item
		ru.Limits = append(ru.Limits, lim)
	}
	if b := rs.Budget; b != nil {
		if b.Unit == 0 || b.Units <= 0 || b.Per <= 0 {
			return nil, fmt.Errorf("rule %q budget %q: %v units per %v in units of %d: want all three positive", rs.Name, b.Name, b.Units, b.Per, b.Unit)
		}
		// As a limit's (countsFor): an odd threshold counts everything
		// twice, so the halving loses no half count; the tick follows the
		// whole threshold.
		theta := thresholdFor(b.Units / float64(b.Unit))
		scale := 1 + theta&1
		tick := TickFor(b.Units/float64(b.Unit), b.Per, float64(theta))
		ru.Budget = &Budget{Spec: *b, Tick: tick, Theta: theta * scale, Scale: scale, sk: sketch(tick, buckets),
			Cost: counts(b.Cost, b.Unit) * scale, Reserve: counts(b.Reserve, b.Unit) * scale, Held: NewCountMin()}
	}
	var old *Rule // the same rule in the running Set
	if prev != nil {
		for _, rs := range [2][]*Rule{prev.Rules, prev.RLSRules} {
			for _, o := range rs {
				if o.Name == ru.Name {
					old = o
				}
			}
		}
	}
	// Top offenders decay with the rule's first limit: the metric shows
	// today's, not yesterday's. Kept across a reload while that sketch is.
	switch {
	case len(ru.Limits) == 0:
		ru.top = epochsketch.NewTopK(10) // never offered to
	case old != nil && len(old.Limits) > 0 && old.Limits[0].sk == ru.Limits[0].sk:
		ru.top = old.top
	default:
		ru.top = epochsketch.NewTopKFor(ru.Limits[0].sk, 10)
	}
	if rs.MaxInFlight > 0 {
		ru.InFlight = NewCountMin()
		if old != nil && old.InFlight != nil {
			ru.InFlight = old.InFlight // requests in flight stay counted
		}
	}
	if b := ru.Budget; b != nil && old != nil && old.Budget != nil && old.Budget.Spec.Name == b.Spec.Name && old.Budget.Spec.Unit == b.Spec.Unit {
		b.Held = old.Budget.Held // reservations in flight stay held
	}
	if e.counts[ru.Name] == nil {
		e.counts[ru.Name] = &Counts{}
	}
	ru.Counts = e.counts[ru.Name]
	return ru, nil
}

// Retire closes the sketches of old that cur does not use. Call it once
// cur is in use and no request reads old any more (requests that still do
// read a closed sketch correctly: Close only stops its clock).
func (e *Engine) Retire(old, cur *Set) {
	if old == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, sk := range old.sketches {
		if cur == nil || cur.sketches[k] != sk {
			sk.Close()
		}
	}
}

// Decisions calls f with each rule's count of decisions by outcome, real
// and shadow, in no order: since the Engine began, across reloads.
func (e *Engine) Decisions(f func(rule string, c *Counts)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, c := range e.counts {
		f(name, c)
	}
}

// counts is units in counts of unit, rounded up, at most a uint32.
func counts(units, unit uint64) uint32 {
	return uint32(min((units+unit-1)/unit, math.MaxUint32))
}
