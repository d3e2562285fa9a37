package sketchproxy

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// NewKeysConfig is the key-rotation defense. A key is new when no request
// of it was seen within about Remember. While new keys per second spike
// above SpikeFactor times their recent average (and above MinPerSecond),
// keys first seen during the spike get BudgetFactor of every limit and
// budget until Window passes. A key seen before the spike is never
// affected. For Warmup after a start without a state file no spike is
// declared: every key is new then, and the average is learning.
type NewKeysConfig struct {
	Disabled     bool     `yaml:"disabled"`
	SpikeFactor  float64  `yaml:"spike_factor"`   // default 4
	MinPerSecond float64  `yaml:"min_per_second"` // default 50
	BudgetFactor float64  `yaml:"budget_factor"`  // default 0.25
	Window       Duration `yaml:"window"`         // default 1m
	Remember     Duration `yaml:"remember"`       // default 1h
	Warmup       Duration `yaml:"warmup"`         // default 1m; 0 (negative in code): none
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
