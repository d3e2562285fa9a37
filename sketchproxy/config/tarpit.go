package config

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// TarpitConfig is the ladder for keys over a limit, in rules with tarpit:
// true, and its hard bounds. A key's level is its estimate divided by the
// limit's threshold: at most 1 is allowed; above DelayAbove it is delayed
// and then proxied; above DripAbove it gets a 429 dripped slowly without
// reaching the upstream; above RejectAbove an immediate 429; above
// BanAbove a 429 with Connection: close and a Retry-After of at least
// BanFor. So with the defaults a tarpitted key's requests reach the
// upstream up to 1.5 times its limit (delayed past 1), not 1 time: set
// DripAbove to DelayAbove for a ladder that proxies nothing over the
// limit. The steps must climb: 1 <= DelayAbove <= DripAbove <=
// RejectAbove <= BanAbove.
type TarpitConfig struct {
	// DelayAbove is the level above which a request is held before it is
	// proxied, for longer the further over it is (at most MaxDelay).
	DelayAbove float64 `yaml:"delay_above" example:"1"`
	// DripAbove is the level above which a request is answered 429,
	// dripped a byte every DripInterval, and never proxied.
	DripAbove float64 `yaml:"drip_above" example:"1.5"`
	// RejectAbove is the level above which a request gets an immediate
	// 429.
	RejectAbove float64 `yaml:"reject_above" example:"2"`
	// BanAbove is the level above which the key is banned: 429 with
	// Connection: close until BanFor passes.
	BanAbove float64 `yaml:"ban_above" example:"8"`
	// BanFor is the least a ban lasts.
	BanFor Duration `yaml:"ban_for" example:"10m"`
	// MaxDelay is the longest a request is held, delayed or dripped, up to
	// 10m (0, or a negative value in code: none, every refusal is
	// immediate).
	MaxDelay Duration `yaml:"max_delay" example:"5s"`
	// DripInterval is the pause between dripped bytes: more than 0, and
	// at most MaxDelay.
	DripInterval Duration `yaml:"drip_interval" example:"500ms"`
	// MaxHeld caps the requests held at once, over all keys, up to 2^20. A
	// request that would pass it gets an immediate 429 instead:
	// tarpitting never exhausts the proxy. 0 (or a negative value in code)
	// holds none.
	MaxHeld int `yaml:"max_held" example:"256"`
	// MaxHeldPerKey caps the requests of one key held at once, as MaxHeld
	// caps all of them.
	MaxHeldPerKey int `yaml:"max_held_per_key" example:"2"`
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
