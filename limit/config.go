package limit

import (
	"errors"
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// MaxBurst is the largest Burst, 133,152 (rate.MaxBurst): a key's count
// holds two counts per request, plus one, in a smooth sketch's 24 bits
// (docs/DESIGN.md, Smooth decay).
const MaxBurst = rate.MaxBurst

// Config configures a Limiter. Requests and Per are required, so the zero
// Config is not valid; every other zero field means the documented
// default. A Config is a plain value: NewWith copies it and never mutates
// it.
type Config struct {
	// Requests per Per is the limit: a key sending more is admitted at
	// this rate and at most 2.7% more (rate.Excess); one sending evenly at
	// it is never refused.
	Requests int
	Per      time.Duration

	// Burst is the most requests an idle key is admitted at once. 0 means
	// Requests (package rate, "The default Burst"). In any window of
	// length w a key is admitted at most Burst × 17/16 + Requests × 1.05 ×
	// w/Per + 1 (package rate, What a client may count on). The burst is a
	// first burst: a key held at its limit has none left, whatever its
	// Burst, and a client that sends its quota in clumps needs a higher
	// rate, not a higher burst. At most MaxBurst.
	Burst int

	// NumBuckets sizes the memory: NumBuckets × 64 bytes, whatever the
	// number of keys. 0 means epochsketch.DefaultNumBuckets (4 MiB).
	//
	// Its capacity is in keys at their limit per tick (package rate's
	// tick, about Per × Burst × 0.7 / Requests; 0.62 × Per for a Burst of
	// 1). A key
	// reads a count of at least 1 until its count decays below one,
	// bits.Len(2 × Burst) ticks after its last request (2 ticks for a
	// Burst of 1, 5 for 10, 8 for 100), so epochsketch.BucketsFor(K ×
	// bits.Len(2 × Burst)) buckets hold K keys reaching their limit in
	// every tick: the default 4 MiB holds 65,536 a tick with a Burst of 1,
	// 26,214 with a Burst of 10. (A smooth sketch's table holds 32 to 63
	// times a count, so a key's slot is empty some ticks later; until then
	// a key reading 1 is taken by a new key's first lottery draw 93% of
	// the time.)
	// At that load a client at 3 times its limit was held to it exactly,
	// and at most 2 of 3,968 new keys took counts from a key at its limit
	// (Burst 1; none with Bursts of 2 and 10: TestOverflowCapacity). Past it, new keys meet buckets full of keys
	// at their limit, Overflow says what happens, and Stats shows it.
	NumBuckets int

	// Clock supplies the time: nil means the wall clock. An
	// *epochsketch.ManualClock makes tests exact.
	Clock epochsketch.Clock

	// Seed keys the hash, SipHash-1-3 (epochsketch.HashSipHash13: clients
	// choose their keys). 0 means a random key, the right choice in
	// production; a fixed Seed makes tests reproducible.
	Seed uint64

	// Name names the policy in the RateLimit and RateLimit-Policy fields
	// that Middleware writes. "" means "default".
	Name string

	// Overflow is what happens to a new key when memory is past its
	// capacity: its bucket is full of keys at their limit (see NumBuckets
	// and Overflow's values). The zero value, OverflowAdmit, fails open.
	Overflow Overflow
}

// Overflow is what a Limiter does with a new key (one it holds no count
// for: never seen, forgotten after its count decayed, or evicted) whose
// bucket of 8 slots is full of keys at their limit: keys whose count is at
// least half the threshold, that is, at their limit within the last tick.
// Stats counts each outcome. A new key whose bucket has a free slot, or a
// key below its limit to challenge, is tracked or admitted as always. The
// zero Overflow is OverflowAdmit; an Overflow is a plain value.
type Overflow uint8

const (
	// OverflowAdmit (the zero value) lets the new key challenge the
	// weakest key in the sketch's lottery, as any new key in a full
	// bucket does: a win takes counts from that key or evicts it (new in
	// its turn when it returns: it may get up to its Burst again;
	// Stats.ChippedAtLimit and EvictedAtLimit), a loss admits the new key
	// untracked (Stats.AdmittedUntracked). It fails open: nobody is
	// refused for lack of memory, and a key at its limit can be admitted
	// past it.
	OverflowAdmit Overflow = iota
	// OverflowRefuse refuses the new key (Stats.RefusedNew), writing
	// nothing: a key at its limit is never chipped or evicted by a new
	// key, so it is held to its limit, and new keys wait until a count in
	// their bucket decays below half the threshold (Decision.RetryAfter
	// says when the bucket's weakest key's does). It fails closed for new
	// keys in such buckets only: in a bucket that holds a key below its
	// limit, a new key still challenges it as OverflowAdmit's do, and a
	// loss admits it untracked (Stats.AdmittedUntracked): at 16 times the
	// capacity, a client arriving during the flood at 3 times a limit of
	// 10 per second was admitted 18 times untracked in its first 0.7 s,
	// 318 times in 30 s against 310 (go test -run
	// TestOverflowRefuseNewClient -v ./limit).
	OverflowRefuse
	// OverflowShare gives new keys a share: a quarter of their requests,
	// drawn at random, are treated as OverflowAdmit treats them, and the
	// rest are refused as OverflowRefuse refuses them. Keys at their limit
	// meet a quarter of the lottery's challenges, and new keys get about a
	// quarter of what they ask while the pressure lasts, as SketchProxy's
	// new_keys defence gives keys first seen during a spike a quarter of
	// each limit.
	OverflowShare
)

// String returns the constant's name.
func (o Overflow) String() string {
	switch o {
	case OverflowAdmit:
		return "OverflowAdmit"
	case OverflowRefuse:
		return "OverflowRefuse"
	case OverflowShare:
		return "OverflowShare"
	}
	return fmt.Sprintf("Overflow(%d)", uint8(o))
}

// Validate reports whether c is usable, with an error that says which field
// is wrong and what to do. NewWith panics with the same message.
func (c Config) Validate() error {
	_, err := c.compile()
	return err
}

// compiled is what a Limiter needs from a Config.
type compiled struct {
	lim rate.Limit
	cfg epochsketch.Config
}

// compile checks c and compiles its rate (package rate: the same words
// give the same limit as SketchProxy's) and its sketch's configuration.
func (c Config) compile() (compiled, error) {
	var p compiled
	switch {
	case c.Requests < 1:
		return p, fmt.Errorf("limit: Config.Requests is %d: want at least 1 request per Per", c.Requests)
	case c.Burst < 0 || c.Burst > MaxBurst:
		return p, fmt.Errorf("limit: Config.Burst is %d: want 0 (the same as Requests) or 1 to %d", c.Burst, MaxBurst)
	case c.Name != "" && !printable(c.Name):
		return p, fmt.Errorf("limit: Config.Name is %q: want printable ASCII without quotes or backslashes (it goes in a header)", c.Name)
	case c.Overflow > OverflowShare:
		return p, fmt.Errorf("limit: Config.Overflow is %v: want OverflowAdmit (the zero value), OverflowRefuse or OverflowShare", c.Overflow)
	}
	lim, err := rate.Rate{Requests: float64(c.Requests), Per: c.Per, Burst: float64(c.Burst)}.Compile()
	var re *rate.Error
	if errors.As(err, &re) {
		return p, fmt.Errorf("limit: Config.%s: %s", re.Field, re.Msg)
	}
	p.lim = lim
	p.cfg = epochsketch.Config{NumBuckets: c.NumBuckets, TickDuration: lim.Tick, Clock: c.Clock, Seed: c.Seed, Hash: epochsketch.HashSipHash13, SmoothDecay: true}
	if err := p.cfg.Validate(); err != nil {
		return p, fmt.Errorf("limit: %w", err)
	}
	return p, nil
}

// printable reports whether s can go between the quotes of a structured
// field's string as it is.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
