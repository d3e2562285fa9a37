package sketchproxy

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// TarpitConfig is the ladder for keys over a limit and its hard bounds. A
// key's level is its estimate divided by the limit's threshold: at most 1 is
// allowed; above DelayAbove it is delayed before it is proxied; above
// DripAbove it gets a 429 dripped slowly without reaching the upstream;
// above RejectAbove an immediate 429; above BanAbove a 429 with Connection:
// close and a Retry-After of at least BanFor.
type TarpitConfig struct {
	DelayAbove  float64  `yaml:"delay_above"`  // default 1 (delay anything over the limit)
	DripAbove   float64  `yaml:"drip_above"`   // default 1.5
	RejectAbove float64  `yaml:"reject_above"` // default 2
	BanAbove    float64  `yaml:"ban_above"`    // default 8
	BanFor      Duration `yaml:"ban_for"`      // default 10m
	// MaxDelay is the longest a request is held, delayed or dripped
	// (default 5s; 0, or a negative value in code: none, every refusal is
	// immediate).
	MaxDelay Duration `yaml:"max_delay"`
	// DripInterval is the pause between dripped bytes (default 500ms).
	DripInterval Duration `yaml:"drip_interval"`
	// MaxHeld caps requests held at once, over all keys (default 256);
	// MaxHeldPerKey per key (default 2). A request that would pass a cap
	// gets an immediate 429 instead: tarpitting never exhausts the proxy.
	// 0 (or a negative value in code) holds none.
	MaxHeld       int `yaml:"max_held"`
	MaxHeldPerKey int `yaml:"max_held_per_key"`
}

// prepare applies the tarpit section's defaults and checks the ladder and
// its bounds.
func (t *TarpitConfig) prepare(c *Config) error {
	if err := t.defaults(c); err != nil {
		return err
	}
	if !(1 <= t.DelayAbove && t.DelayAbove <= t.DripAbove && t.DripAbove <= t.RejectAbove && t.RejectAbove <= t.BanAbove) {
		return c.errAt(fmt.Sprintf("the ladder must climb: 1 <= delay_above (%g) <= drip_above (%g) <= reject_above (%g) <= ban_above (%g)",
			t.DelayAbove, t.DripAbove, t.RejectAbove, t.BanAbove), "tarpit")
	}
	if t.MaxDelay < 0 || time.Duration(t.MaxDelay) > 10*time.Minute {
		return c.errAt("want 0 to 10m", "tarpit", "max_delay")
	}
	if t.DripInterval <= 0 || t.MaxDelay > 0 && t.DripInterval > t.MaxDelay {
		return c.errAt("want more than 0 and at most max_delay", "tarpit", "drip_interval")
	}
	if t.MaxHeld < 0 || t.MaxHeldPerKey < 0 || t.MaxHeld > 1<<20 {
		return c.errAt("caps must be 0 to 2^20", "tarpit")
	}
	return nil
}

// defaults fills the fields left out; a negative field whose 0 means none
// is an error only when the file writes it.
func (t *TarpitConfig) defaults(c *Config) error {
	orDefault(&t.DelayAbove, 1)
	orDefault(&t.DripAbove, 1.5)
	orDefault(&t.RejectAbove, 2)
	orDefault(&t.BanAbove, 8)
	orDefault(&t.BanFor, Duration(10*time.Minute))
	if err := orNone(c, &t.MaxDelay, Duration(5*time.Second), "tarpit", "max_delay"); err != nil {
		return err
	}
	orDefault(&t.DripInterval, Duration(500*time.Millisecond))
	if err := orNone(c, &t.MaxHeld, 256, "tarpit", "max_held"); err != nil {
		return err
	}
	return orNone(c, &t.MaxHeldPerKey, 2, "tarpit", "max_held_per_key")
}

// spec is the prepared ladder as the engine runs it.
func (t *TarpitConfig) spec() engine.TarpitSpec {
	return engine.TarpitSpec{
		DelayAbove: t.DelayAbove, DripAbove: t.DripAbove,
		RejectAbove: t.RejectAbove, BanAbove: t.BanAbove,
		BanFor: time.Duration(t.BanFor), MaxDelay: time.Duration(t.MaxDelay),
		MaxHeld: t.MaxHeld, MaxHeldPerKey: t.MaxHeldPerKey,
	}
}
