package sketchproxy

import (
	"log/slog"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/fleet"
)

// The fleet lives in internal/fleet; these are its entry points as this
// package has offered them.

// NewEngineFleet checks cfg as a config file's fleet section is checked
// (the same defaults and messages: a *ConfigError naming the field, such
// as fleet.secret), reading its files and environment variables, and
// starts its sync with Redis, for engine.Options.Fleet. now is the
// engine's clock (nil: the wall clock); log gets the fleet's warnings
// (nil: slog's default). cfg is not changed. Call stop once no engine
// uses the fleet: it ends the sync and closes the connections.
func NewEngineFleet(cfg *FleetConfig, log *slog.Logger, now func() time.Time) (f engine.Fleet, stop func(), err error) {
	fl, err := fleet.Open(cfg, log, now)
	if err != nil {
		return nil, nil, err
	}
	return fl, fl.Close, nil
}

// CheckFleet checks cfg as NewEngineFleet does, without reading its files
// or environment variables (what they hold is checked when the fleet
// starts): for a config written where its secrets are not, as a
// Caddyfile is adapted. cfg is not changed.
func CheckFleet(cfg *FleetConfig) error { return config.CheckFleet(cfg) }

// FleetSizeWarning is the warning for a fleet section that gives neither
// replicas nor min_replicas, where the state file keeps no membership
// either (a first start, or no state_file): "" for none. cmd/sketchproxy
// logs it at start, and -check prints it.
func FleetSizeWarning(cfg *Config) string { return fleet.SizeWarning(cfg) }
