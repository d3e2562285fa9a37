package sketchproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Limiter is one limit of SketchProxy's engine as a Go rate limiter, for a
// program that calls it itself (a gRPC service, a queue consumer) rather
// than through an HTTP door: what package limit's Limiter is, plus a
// fleet. With a FleetConfig, Limiters in several processes enforce one
// limit together through Redis, sharing only the keys heavy enough to
// matter, exactly as SketchProxy's replicas do (docs/fleets.md):
// package limit's way to run several replicas. The same words give the
// same limit as package limit's (package rate compiles both).
//
// A Limiter is safe for concurrent use. Close it to stop its fleet.
type Limiter struct {
	mw   *Middleware
	rule *engine.Rule
}

// LimiterConfig configures a Limiter: Requests per Per, with bursts of
// Burst (0: Requests), as a rule's limit.
type LimiterConfig struct {
	Requests float64
	Per      time.Duration
	Burst    float64
	// Name names the limit in logs and metrics (default "limit").
	Name string
	// Fleet shares the heavy keys' counts with the other replicas through
	// Redis (nil: this process alone).
	Fleet *FleetConfig
	// Buckets sizes the sketch, 64 bytes a bucket (default 65536).
	Buckets int
	// Clock, Seed and Logger are as Options'.
	Clock  epochsketch.Clock
	Seed   uint64
	Logger *slog.Logger
}

// NewLimiter returns a Limiter for cfg, or an error that names the field
// at fault.
func NewLimiter(cfg LimiterConfig) (*Limiter, error) {
	name := cfg.Name
	if name == "" {
		name = "limit"
	}
	c := &Config{
		Admin:   "off",
		Sketch:  SketchConfig{Buckets: cfg.Buckets},
		NewKeys: NewKeysConfig{Disabled: true},
		Fleet:   cfg.Fleet,
		Rules:   []Rule{{Name: name, Limits: []Limit{{Name: "rate", Requests: cfg.Requests, Per: Duration(cfg.Per), Burst: cfg.Burst}}}},
	}
	mw, err := New(c, http.NotFoundHandler(), Options{Clock: cfg.Clock, Seed: cfg.Seed, Logger: cfg.Logger})
	if err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("sketchproxy: LimiterConfig: %s", limiterField(ce))
		}
		return nil, err
	}
	return &Limiter{mw: mw, rule: mw.state.Load().set.Rules[0]}, nil
}

// limiterField says a config error in LimiterConfig's words.
func limiterField(ce *ConfigError) string {
	for from, to := range map[string]string{
		"rules[0].limits[0].requests": "Requests", "rules[0].limits[0].per": "Per",
		"rules[0].limits[0].burst": "Burst", "rules[0].limits[0]": "Requests and Per",
		"rules[0].name": "Name", "sketch.buckets": "Buckets",
	} {
		if ce.Field == from {
			return to + ": " + ce.Msg
		}
	}
	return ce.Error()
}

// Allow reports whether one request of key may happen now, and counts it
// if so.
func (l *Limiter) Allow(key string) bool { return l.Decide(key, 1).Allowed }

// Decide decides n requests of key now, as one, and counts them if they
// are admitted; it returns what a response says about the key, in package
// limit's words (limit.Decision).
func (l *Limiter) Decide(key string, n int) limit.Decision {
	st := l.mw.state.Load()
	sc := scratchPool.Get().(*engine.Scratch)
	defer func() { sc.Reset(); scratchPool.Put(sc) }()
	now := l.mw.now()
	// n <= 0 reads the key: judged as it is, nothing counted.
	facts := [1]engine.Fact{{Rule: l.rule, Key: key, Hits: uint32(min(max(n, 0), 1<<30)), ZeroHits: n <= 0}}
	d := l.mw.eng.Decide(context.Background(), st.set, now, &engine.Request{Facts: facts[:], NoDrip: true}, sc)
	defer d.Done()
	remaining, reset := d.Verdicts[0].Left(now)
	out := limit.Decision{Allowed: d.Admitted || n <= 0, Remaining: int(remaining), Reset: reset}
	if !out.Allowed && !d.Never {
		out.RetryAfter = d.Wait
	}
	return out
}

// Close stops the fleet's sync and the sketch's clock.
func (l *Limiter) Close() error { return l.mw.Close() }
