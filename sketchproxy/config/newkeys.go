package config

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// NewKeysConfig is the key-rotation defense. A key is new when no request
// of it was seen within about Remember. While new keys per second spike
// above SpikeFactor times their recent average (and above MinPerSecond),
// keys first seen during the spike get BudgetFactor of every limit and
// budget until they come back a quarter to half a Window later. A key seen
// before the spike is never affected. The average learns the new keys of
// calm seconds and, during a spike, only the keys that came back; it never
// falls during a spike and grows at most twice per Window, so that neither
// a flood nor a ramp of new keys can teach it. For Warmup after a start
// without a state file no spike is declared: every key is new then, and
// the average is learning.
type NewKeysConfig struct {
	// Disabled turns the defense off: new keys always get whole limits.
	Disabled bool `yaml:"disabled" example:"true"`
	// SpikeFactor is how many times their recent average new keys per
	// second must reach to be a spike (1 or more).
	SpikeFactor float64 `yaml:"spike_factor" example:"4"`
	// MinPerSecond is the least number of new keys per second that can be
	// a spike, so that a quiet service's few new clients never are.
	MinPerSecond float64 `yaml:"min_per_second" example:"50"`
	// BudgetFactor is the share of every limit and budget that keys first
	// seen during a spike get: more than 0, at most 1.
	BudgetFactor float64 `yaml:"budget_factor" example:"0.25"`
	// Window paces the defense (1s or more): a key first seen during a
	// spike keeps the smaller share for a quarter to half of it, until it
	// comes back, and the average of new keys grows at most twice per
	// Window.
	Window Duration `yaml:"window" example:"1m"`
	// Remember is how long a key stays known after its last request: from
	// Window to 30d.
	Remember Duration `yaml:"remember" example:"1h"`
	// Warmup is how long after a start without a state file no spike is
	// declared, up to 24h (0, or a negative value in code: none).
	Warmup Duration `yaml:"warmup" example:"1m"`
}

// prepare applies the new_keys section's defaults and bounds.
func (nk *NewKeysConfig) prepare(c *Config) error {
	orDefault(&nk.SpikeFactor, 4)
	orDefault(&nk.MinPerSecond, 50)
	orDefault(&nk.BudgetFactor, 0.25)
	orDefault(&nk.Window, Duration(time.Minute))
	if nk.SpikeFactor < 1 {
		return c.errAt(fmt.Sprintf("%g: want 1 or more", nk.SpikeFactor), "new_keys", "spike_factor")
	}
	if nk.BudgetFactor <= 0 || nk.BudgetFactor > 1 {
		return c.errAt(fmt.Sprintf("%g: want more than 0 and at most 1", nk.BudgetFactor), "new_keys", "budget_factor")
	}
	if nk.Window < Duration(time.Second) {
		return c.errAt("want 1s or more", "new_keys", "window")
	}
	orDefault(&nk.Remember, Duration(time.Hour))
	if nk.Remember < nk.Window || nk.Remember > Duration(30*24*time.Hour) {
		return c.errAt("want window (default 1m) to 30d", "new_keys", "remember")
	}
	if err := orNone(c, &nk.Warmup, Duration(time.Minute), "new_keys", "warmup"); err != nil {
		return err
	}
	if nk.Warmup < 0 || nk.Warmup > Duration(24*time.Hour) {
		return c.errAt("want 0 to 24h", "new_keys", "warmup")
	}
	return nil
}

// spec is the prepared defense as the engine runs it.
func (nk *NewKeysConfig) spec() engine.NewKeysSpec {
	return engine.NewKeysSpec{
		Disabled: nk.Disabled, SpikeFactor: nk.SpikeFactor,
		MinPerSecond: nk.MinPerSecond, BudgetFactor: nk.BudgetFactor,
		Window: time.Duration(nk.Window), Remember: time.Duration(nk.Remember),
		Warmup: time.Duration(nk.Warmup),
	}
}
