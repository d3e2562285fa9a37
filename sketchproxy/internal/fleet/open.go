package fleet

import (
	"log/slog"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// Open checks cfg as a config file's fleet section is checked (the same
// defaults and messages: a *config.Error naming the field, such as
// fleet.secret), reading its files and environment variables, and starts
// its sync with Redis: a fleet for an engine built outside SketchProxy's
// Middleware, such as the Caddy module's (sketchproxy/caddy), one per
// fleet setting. now is the engine's clock (nil: the wall clock); log gets
// the fleet's warnings (nil: slog's default). cfg is not changed. Close
// the fleet once no engine uses it.
func Open(cfg *config.FleetConfig, log *slog.Logger, now func() time.Time) (*Fleet, error) {
	cfg, fb, err := config.BuildFleet(cfg)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	if now == nil {
		now = time.Now
	}
	f := New(cfg, fb, log, now)
	if cfg.Replicas == 0 && cfg.MinReplicas == 0 {
		// No state file keeps a membership here: every start while
		// Redis is down assumes UnknownReplicas.
		log.Warn("fleet: neither replicas nor min_replicas is set, and nothing keeps the last membership seen across a restart: " + fleetSizeAdvice("min_replicas", "replicas"))
	}
	f.Start()
	return f, nil
}
