package sketchproxy

import (
	"log/slog"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// A fleet for an engine built outside this package: the Caddy module
// (sketchproxy/caddy) builds its own engines, one per fleet setting, and
// needs SketchProxy's fleet for them with SketchProxy's checks and
// messages, so that a fleet block means in a Caddyfile what a fleet
// section means in sketchproxy.yaml.

// NewEngineFleet checks cfg as a config file's fleet section is checked
// (the same defaults and messages: a *ConfigError naming the field, such
// as fleet.secret), reading its files and environment variables, and
// starts its sync with Redis, for engine.Options.Fleet. now is the
// engine's clock (nil: the wall clock); log gets the fleet's warnings
// (nil: slog's default). cfg is not changed. Call stop once no engine
// uses the fleet: it ends the sync and closes the connections.
func NewEngineFleet(cfg *FleetConfig, log *slog.Logger, now func() time.Time) (f engine.Fleet, stop func(), err error) {
	cfg, fb, err := config.BuildFleet(cfg)
	if err != nil {
		return nil, nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	fl := newFleet(cfg, fb, log, now)
	if cfg.Replicas == 0 && cfg.MinReplicas == 0 {
		// No state file keeps a membership here: every start while
		// Redis is down assumes fleetUnknownReplicas.
		log.Warn("fleet: neither replicas nor min_replicas is set, and nothing keeps the last membership seen across a restart: " + fleetSizeAdvice("min_replicas", "replicas"))
	}
	fl.start()
	return fl, fl.close, nil
}

// CheckFleet checks cfg as NewEngineFleet does, without reading its files
// or environment variables (what they hold is checked when the fleet
// starts): for a config written where its secrets are not, as a
// Caddyfile is adapted. cfg is not changed.
func CheckFleet(cfg *FleetConfig) error { return config.CheckFleet(cfg) }
