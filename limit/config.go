package limit

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/epochsketch/epochsketch"
)

// MaxBurst is the largest Burst, 8,388,607: a key's count holds two units
// per request and saturates at epochsketch.MaxCount.
const MaxBurst = epochsketch.MaxCount / unit

// unit is what one request adds to a key's count. Two, so that an odd
// Burst still halves to a whole number of units each tick, and a key over
// its limit gets exactly Burst/2 requests per tick on average, not the
// Burst/2 rounded up (see Limiter).
const unit = 2

// Config configures a Limiter. Requests and Per are required; every other
// zero field means the documented default. NewWith copies the Config; it
// never mutates it.
type Config struct {
	// Requests per Per is the limit: a key sending more is admitted at
	// exactly this rate, and a key sending at most Requests in every
	// window of Per is never refused (with the default Burst).
	Requests int
	Per      time.Duration

	// Burst is the most requests an idle key is admitted at once. 0 means
	// 2 × Requests: then a key that sends at most Requests in every window
	// of Per is never refused. A smaller Burst spreads a
	// flooding key's admissions more evenly over Per (it shortens the
	// tick to Per × Burst / (2 × Requests)); then a key is never refused
	// while it sends at most Burst/2 per tick. At most MaxBurst.
	Burst int

	// NumBuckets sizes the memory: NumBuckets × 64 bytes, whatever the
	// number of keys. 0 means epochsketch.DefaultNumBuckets (4 MiB). Size
	// it with epochsketch.BucketsFor(the keys that may be at their limit at
	// once): such a key is never forgotten, and a key that cannot be
	// tracked is admitted.
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
}

// Validate reports whether c is usable, with an error that says which field
// is wrong and what to do. NewWith panics with the same message.
func (c Config) Validate() error {
	_, err := c.compile()
	return err
}

// compiled is what a Limiter needs from a Config.
type compiled struct {
	burst int
	tick  time.Duration
	cfg   epochsketch.Config
}

func (c Config) compile() (compiled, error) {
	var p compiled
	switch {
	case c.Requests < 1:
		return p, fmt.Errorf("limit: Config.Requests is %d: want at least 1 request per Per", c.Requests)
	case c.Per <= 0:
		return p, fmt.Errorf("limit: Config.Per is %v: want a positive duration, such as time.Second", c.Per)
	case c.Burst < 0 || c.Burst > MaxBurst:
		return p, fmt.Errorf("limit: Config.Burst is %d: want 0 (2 × Requests) or 1 to %d", c.Burst, MaxBurst)
	case c.Burst == 0 && c.Requests > MaxBurst/2:
		return p, fmt.Errorf("limit: Config.Requests is %d: the default Burst, 2 × Requests, passes %d; set Burst, or count in coarser units", c.Requests, MaxBurst)
	case c.Name != "" && !printable(c.Name):
		return p, fmt.Errorf("limit: Config.Name is %q: want printable ASCII without quotes or backslashes (it goes in a header)", c.Name)
	}
	p.burst = c.Burst
	if p.burst == 0 {
		p.burst = 2 * c.Requests
	}
	// tick = Per × Burst / (2 × Requests), in 128 bits: a key over the
	// limit gets Burst/2 requests a tick, Requests per Per.
	hi, lo := bits.Mul64(uint64(c.Per), uint64(p.burst))
	den := 2 * uint64(c.Requests)
	var q uint64
	if hi < den {
		q, _ = bits.Div64(hi, lo, den)
	}
	if hi >= den || q > math.MaxInt64 {
		return p, fmt.Errorf("limit: %d per %v with Burst %d needs a tick beyond 292 years: lower Burst or Per", c.Requests, c.Per, p.burst)
	}
	p.tick = time.Duration(q)
	if p.tick < epochsketch.MinTickDuration {
		if mb := minBurst(c.Requests, c.Per); mb > MaxBurst {
			return p, fmt.Errorf("limit: %d per %v needs a tick of %v, under %v, and no Burst up to MaxBurst (%d) lengthens it enough: write the rate over a Per of %v or more, with Requests to match", c.Requests, c.Per, p.tick, epochsketch.MinTickDuration, MaxBurst, epochsketch.MinTickDuration)
		}
		return p, fmt.Errorf("limit: %d per %v with Burst %d needs a tick of %v, under %v: raise Burst to at least %d", c.Requests, c.Per, p.burst, p.tick, epochsketch.MinTickDuration, minBurst(c.Requests, c.Per))
	}
	p.cfg = epochsketch.Config{NumBuckets: c.NumBuckets, TickDuration: p.tick, Clock: c.Clock, Seed: c.Seed, Hash: epochsketch.HashSipHash13}
	if err := p.cfg.Validate(); err != nil {
		return p, fmt.Errorf("limit: %w", err)
	}
	return p, nil
}

// minBurst is the smallest Burst whose tick is at least MinTickDuration.
func minBurst(requests int, per time.Duration) uint64 {
	hi, lo := bits.Mul64(2*uint64(requests), uint64(epochsketch.MinTickDuration))
	if hi >= uint64(per) {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, uint64(per))
	if r != 0 {
		q++
	}
	return q
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
