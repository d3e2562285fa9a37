// Package engine decides SketchProxy's rate limits, wallets, bans and
// tarpit levels for every door: the HTTP middleware, the forward-auth
// check, Envoy's rate-limit service and the Caddy module. It is the only
// code of the module that holds a sketch. It imports neither net/http nor
// gRPC: a door finds the rules a request matches and its key under each,
// hands them to Decide as a Request, and translates the Decision it gets
// back into its own protocol.
//
// A configuration compiles into an immutable Set (Compile); a reload
// compiles the new one, reusing the sketches it keeps, swaps it in, and
// retires the old (Retire). Every limit is compiled by package rate, as
// package limit's are, so the same words mean the same limit everywhere.
// Decide is the one call that decides: it evaluates every rule, holds a
// tarpitted request, checks and charges wallets, takes in-flight places,
// counts the request (one conditional add per limit: check and count in one
// atomic step), counts the outcome and computes Retry-After and the
// RateLimit fields. The door then answers, and calls Decision.Done when the
// request ends (sketchproxy/docs/design.md).
package engine

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// Options are what an Engine needs besides its rule sets.
type Options struct {
	// Clock drives the sketches and the waits (nil: the wall clock).
	Clock epochsketch.Clock
	// Seed makes the sketches' hashes and lotteries repeatable (0: random).
	Seed uint64
	// Fleet shares heavy keys' counts with other replicas (nil: none).
	// Its limits' counts halve at each tick's end (rate.CompileHalving),
	// as its shares are reckoned.
	Fleet Fleet
	// Halving counts limits as a fleet does without one: the replica
	// alone that a fleet's figures are measured against.
	Halving bool
	// Sleep waits for d or until ctx ends: a tarpit's hold (nil: a timer).
	// Tests inject it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Fleet shares heavy keys' counts with other replicas, behind an interface
// so that the engine knows nothing of Redis. It answers with an estimate
// whose part above the local count is what this replica may not use: the
// engine admits a request only if the local count plus the request stays
// within theta less that part (one conditional add), so the fleet enforces
// this replica's share of the limit, and the estimate gives the levels,
// the fields and Retry-After.
type Fleet interface {
	// Estimate answers q: the estimate of its sketch key to decide and
	// report against, and what the engine owes the fleet once the
	// request is decided (Answer). The fleet may keep q.Local, to read
	// the key again at its next round (it must copy q.Key). It may wait
	// on the network (a claim on a key just shared), at most the
	// fleet's timeout.
	Estimate(q Query) Answer
	// Counted reports that an admitted request was counted in k's count
	// of this replica's sketch, after an answer that asked to be told.
	Counted(k []byte)
	// Settle reports what became of a request the fleet held room for
	// in k (Answer.Hold, hold): counted (add in k's count now) or not
	// (refused after all: the room is free again). Once per hold.
	Settle(k []byte, hold, add uint32, counted bool)
	// WalletsClosed reports whether wallets fail closed right now (their
	// counts cannot be shared), and how long a refused client should wait.
	WalletsClosed() (bool, time.Duration)
}

// Query is what the engine asks a Fleet of one sketch key.
type Query struct {
	Key   []byte
	Local Local // this replica's sketch of Key
	Tick  time.Duration
	Theta uint32 // its limit's threshold
	// Count is Key's count in Local, read just now, before the request's
	// hits; Add is what the request adds (0: the engine only reads, for
	// a wait or a report).
	Count, Add uint32
	// Counted: the request's hits are in Local already (its rule counts
	// refused requests, so it counted them first); the answer is then
	// before them, and the engine adds them.
	Counted bool
	// Wallet: a wallet's spend, which the engine checks against what
	// requests in flight reserve, not with a conditional add: the fleet
	// answers from what it knows and holds nothing.
	Wallet bool
	// Unconditional: the engine counts the request whatever the answer
	// (a shadow rule, a quota): the fleet holds nothing for it.
	Unconditional bool
	// NoWait: the engine holds locks other requests wait for (a
	// wallet's): the fleet answers from what it knows, without waiting
	// on the network.
	NoWait bool
	Now    time.Time
	// Start is the request's: when it first waited on the network, on
	// the wall clock (zero until then; the fleet sets it). The fleet
	// waits until its timeout from then, over all of the request's
	// queries. nil: from now.
	Start *time.Time
}

// Answer is a Fleet's answer to a Query.
type Answer struct {
	// Est is the estimate: the request is refused if Est plus Add passes
	// its threshold, and admitted only if the local count plus Add stays
	// within the threshold less Est's part past Count.
	Est uint32
	// Tell asks the engine to call Counted once the request is counted:
	// the fleet then tells the other replicas at once.
	Tell bool
	// Hold, where not 0, names room the fleet holds for this request (a
	// claim that Redis granted): the engine calls Settle with it once
	// the request is counted or refused.
	Hold uint32
	// Ceiling, where not 0, is the most the local count may reach under
	// this answer (a key's promotion point: past it the key is shared,
	// and the fleet answers anew). A conditional add that racing requests
	// made fail against it asks the fleet again, with the count then.
	Ceiling uint32
}

// Local is one of this replica's sketches, as a Fleet reads it:
// EstimateBytes at the sketch's own tick, EstimateBytesAt at t's (or
// the sketch's, if later).
type Local interface {
	EstimateBytes(k []byte) uint32
	EstimateBytesAt(t time.Time, k []byte) uint32
}

// Engine decides requests against the Set a door gives it. It holds what
// outlives a reload: the meter of new keys, when keys were last marked new
// or banned, and the outcome counts by rule name. Safe for concurrent use.
type Engine struct {
	opts    Options
	started time.Time

	mu     sync.Mutex // Compile, Retire, SaveState: one at a time
	counts map[string]*Counts

	clients  *Tally       // requests in progress per client (Request.ClientCap)
	held     atomic.Int64 // tarpitted requests held now
	heldKeys *Tally       // the same, per rule and key
	wallets  WalletLocks  // a wallet's check and its charge, as one step per key

	spike         spikeMeter
	restoredMeter atomic.Bool  // a state file restored the new-key meter
	lastNew       atomic.Int64 // when a key was last marked new (Unix ns; 0: never)
	lastBan       atomic.Int64 // when a key was last banned (Unix ns; 0: never)
}

// New returns an Engine.
func New(opts Options) *Engine {
	if opts.Sleep == nil {
		opts.Sleep = Sleep
	}
	e := &Engine{opts: opts, counts: map[string]*Counts{}, clients: NewTally(), heldKeys: NewTally()}
	e.started = e.Now()
	return e
}

// Sleep waits for d, or until ctx ends (then it returns ctx's error): the
// tarpit's wait, on a timer.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
	// Block refuses every request that adds hits, with no limit to count
	// in (Envoy's requests_per_unit: 0).
	Block bool
}

// LimitSpec is a named limit: Requests per Per with bursts of Burst, as
// package rate compiles it (a zero Burst is Requests). Policy, if set,
// names it in the RateLimit fields instead of "rule-limit".
type LimitSpec struct {
	Name   string
	Policy string
	rate.Rate
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

// TarpitSpec is the tarpit's ladder, in levels (estimate / threshold),
// and its caps: requests held at once in all (MaxHeld) and per key.
type TarpitSpec struct {
	DelayAbove, DripAbove, RejectAbove, BanAbove float64
	BanFor, MaxDelay                             time.Duration
	MaxHeld, MaxHeldPerKey                       int
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
	wallets  bool // a rule has a budget: decisions lock wallets (admit)
}

// sketchKey is what sketches are shared by: limits and wallets with the
// same tick whose thresholds lie in the same power of two (bursts 1, 2-3,
// 4-7, 8-15, ...) share one sketch, so that the keys a bucket compares
// stand against thresholds within a factor of two of each other: a flood
// of one rule's keys under half their limit never evicts another rule's
// keys at theirs (a 20-an-hour client, count 40, beside 1,000-an-hour keys
// at 25 requests, count 50, would otherwise lose its slot). Classes, not
// each threshold, bound the number of sketches: at most 24 per tick. The
// side sketches (new keys, known keys, bans) are class 0.
type sketchKey struct {
	tick    time.Duration
	class   uint32 // bits.Len32 of the threshold: thresholds [2^(class-1), 2^class)
	buckets int
	two     bool
}

// smoothClass marks the class of a sketch whose counts decay smoothly
// (sketchKey): a state file keeps it with the class, so that a smooth
// sketch's counts are read back only into a smooth sketch, and a file
// from before smooth decay restores none of its limits' counts (their
// ticks changed too) rather than misread them.
const smoothClass = 1 << 31

// Class is the sketch class of a threshold (sketchKey): thresholds from
// 2^(class-1) to 2^class - 1 counts share a class.
func Class(threshold uint32) uint32 { return uint32(bits.Len32(threshold)) }

// Rule is a compiled rule.
type Rule struct {
	Name         string
	Shadow       bool
	Tarpit       bool
	CountRefused bool
	Block        bool
	MaxInFlight  int
	Limits       []*Limit
	Budget       *Budget // nil: no wallet
	InFlight     *Tally  // requests in flight per key; nil without MaxInFlight
	Counts       *Counts // decisions by outcome, kept across reloads by name
	// Policy is the rule's items of the RateLimit-Policy field.
	Policy string
	top    *epochsketch.TopK
}

// Limit is a compiled limit: package rate's (its tick, threshold and
// policy) with its name as the RateLimit fields give it.
type Limit struct {
	rate.Limit
	Name   string
	Policy string // the RateLimit policy's name: rule-limit
	Quoted string // the policy's name, quoted, for RateLimit items
	Item   string // its RateLimit-Policy item: "rule-limit";q=Q;w=W
	sk     *epochsketch.Sketch
}

// Budget is a compiled wallet: Units per Per in counts of Spec.Unit units,
// as package rate compiles a limit of that many requests (each charged
// unit adds rate.Unit counts).
type Budget struct {
	Spec BudgetSpec
	Lim  rate.Limit
	// Cost and Reserve in counts (rounded up to whole units).
	Cost, Reserve uint32
	Held          *Tally // counts reserved by requests in flight, per key
	sk            *epochsketch.Sketch
}

// Compile compiles spec into a Set. Sketches of prev (the running Set, or
// nil) whose tick, threshold class and size spec keeps are shared, with their
// counts, and so are in-flight counts, reservations and top offenders of
// rules that keep their names. Nothing of prev changes: call Retire once
// the new Set is in use.
func (e *Engine) Compile(spec *Spec, prev *Set) (*Set, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := &Set{sketches: map[sketchKey]*epochsketch.Sketch{}, tarpit: spec.Tarpit, nk: spec.NewKeys}
	get := func(tick time.Duration, threshold uint32, buckets int, smooth bool) *epochsketch.Sketch {
		k := sketchKey{tick, Class(threshold), buckets, spec.TwoChoice}
		if smooth {
			k.class |= smoothClass
		}
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
			// Limits' counts decay smoothly: quota comes back step by
			// step, not at instants every key shares (docs/DESIGN.md,
			// Smooth decay).
			SmoothDecay: smooth,
		})
		s.sketches[k] = sk
		return sk
	}
	for j, rs := range [2][]RuleSpec{spec.Rules, spec.RLSRules} {
		for i := range rs {
			ru, err := e.compileRule(&rs[i], prev, spec.Buckets, get)
			if err != nil {
				for k, sk := range s.sketches {
					if prev == nil || prev.sketches[k] != sk {
						sk.Close()
					}
				}
				return nil, err
			}
			s.wallets = s.wallets || ru.Budget != nil
			if j == 0 {
				s.Rules = append(s.Rules, ru)
			} else {
				s.RLSRules = append(s.RLSRules, ru)
			}
		}
	}
	// Side sketches: keys seen lately, new keys during a spike, and bans.
	s.known = get(spec.NewKeys.Remember, 0, spec.Buckets, false)
	s.newKeys = get(markTick(&spec.NewKeys), 0, 1<<12, false)
	s.banTick = max(time.Millisecond, spec.Tarpit.BanFor/4)
	s.bans = get(s.banTick, 0, 1<<12, false)
	return s, nil
}

func (e *Engine) compileRule(rs *RuleSpec, prev *Set, buckets int, get func(time.Duration, uint32, int, bool) *epochsketch.Sketch) (*Rule, error) {
	ru := &Rule{Name: rs.Name, Shadow: rs.Shadow, Tarpit: rs.Tarpit, CountRefused: rs.CountRefused, Block: rs.Block, MaxInFlight: rs.MaxInFlight}
	// Limits decay smoothly (docs/DESIGN.md, Smooth decay), but where a
	// fleet shares them: its shares are reckoned tick by tick, for counts
	// that halve at each tick's end (docs/fleets.md).
	smooth := e.opts.Fleet == nil && !e.opts.Halving
	for _, l := range rs.Limits {
		compile := l.Rate.Compile
		if !smooth {
			compile = l.Rate.CompileHalving
		}
		rl, err := compile()
		var re *rate.Error
		if errors.As(err, &re) {
			return nil, fmt.Errorf("rule %q limit %q: %s: %s", rs.Name, l.Name, re.Field, re.Msg)
		}
		lim := &Limit{Limit: rl, Name: l.Name, Policy: l.Policy, sk: get(rl.Tick, rl.Threshold, buckets, smooth)}
		if lim.Policy == "" {
			lim.Policy = rs.Name + "-" + l.Name
		}
		lim.Quoted = strconv.Quote(lim.Policy)
		lim.Item = rl.PolicyItem(lim.Quoted)
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
		// A wallet of N counts per Per is a limit of N requests per Per,
		// burst N: each unit charged adds rate.Unit counts. Its counts
		// halve at each tick's end: a wallet is spent whole and comes back
		// by halves, exactly N per Per however it is spent.
		counts := b.Units / float64(b.Unit)
		rl, err := rate.Rate{Requests: counts, Per: b.Per, Burst: max(1, counts)}.CompileHalving()
		var re *rate.Error
		if errors.As(err, &re) {
			return nil, fmt.Errorf("rule %q budget %q: %s: %s", rs.Name, b.Name, re.Field, re.Msg)
		}
		ru.Budget = &Budget{Spec: *b, Lim: rl, sk: get(rl.Tick, rl.Threshold, buckets, false),
			Cost: countsOf(b.Cost, b.Unit), Reserve: countsOf(b.Reserve, b.Unit), Held: NewTally()}
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
		ru.InFlight = NewTally()
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

// countsOf is units in counts of a wallet whose unit is unit: whole units
// rounded up, rate.Unit counts each.
func countsOf(units, unit uint64) uint32 {
	if units == 0 {
		return 0
	}
	return rate.Counts((units-1)/unit + 1)
}
