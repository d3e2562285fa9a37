package limit

import (
	"errors"
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// MaxBurst is the largest Burst, 8,388,607 (rate.MaxBurst): a key's count
// holds two counts per request and parks at epochsketch.MaxCount.
const MaxBurst = rate.MaxBurst

// Config configures a Limiter. Requests and Per are required; every other
// zero field means the documented default. NewWith copies the Config; it
// never mutates it.
type Config struct {
	// Requests per Per is the limit: a key sending more is admitted at
	// exactly this rate.
	Requests int
	Per      time.Duration

	// Burst is the most requests an idle key is admitted at once. 0 means
	// Requests (package rate, "The default Burst"): a key spreading its
	// requests evenly at up to Requests per Per is never refused. 2 ×
	// Requests makes the tick Per, and then a key that sends at most
	// Requests in every window of Per, however bunched, is never refused.
	// A Burst spreads a flooding key's admissions over Per (the tick is
	// Per × Burst / (2 × Requests)); a key is never refused while it sends
	// at most Burst/2 per tick. At most MaxBurst.
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
	}
	lim, err := rate.Rate{Requests: float64(c.Requests), Per: c.Per, Burst: float64(c.Burst)}.Compile()
	var re *rate.Error
	if errors.As(err, &re) {
		return p, fmt.Errorf("limit: Config.%s: %s", re.Field, re.Msg)
	}
	p.lim = lim
	p.cfg = epochsketch.Config{NumBuckets: c.NumBuckets, TickDuration: lim.Tick, Clock: c.Clock, Seed: c.Seed, Hash: epochsketch.HashSipHash13}
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
