package config

import (
	"errors"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Built is a Config compiled: the copy that New and Reload run on, with
// its defaults applied and checked, and what preparing it read and built
// besides: the key label's secret, the trusted proxies, the rules' allow
// lists, the JWT keys, Envoy's descriptor trees and the fleet's Redis
// options. Nothing in it changes once built: every request of one
// configuration reads it at once, so its users never write to it, nor to
// what its methods return (the Config included).
type Built struct {
	cfg      *Config
	labelKey []byte           // key_label_secret_file's secret, trimmed
	trusted  clientip.Trusted // client_ip.trusted_proxies, parsed
	allow    []AllowSet       // by rule
	jwt      JWTKeys
	rls      RLS
	fleet    FleetBuilt
}

// Build checks c and compiles it. It works on a copy with the defaults
// applied: c itself is not changed. An error is an *Error that names the
// field and, for a parsed file, its line.
func Build(c *Config) (*Built, error) {
	if c == nil {
		return nil, errors.New("sketchproxy: the *Config is nil: pass one from LoadConfig or ParseConfig, or a Config literal")
	}
	b := &Built{cfg: c.clone()}
	if err := b.cfg.prepare(b); err != nil {
		return nil, err
	}
	return b, nil
}

// Config is the config compiled, its defaults applied.
func (b *Built) Config() *Config { return b.cfg }

// File is the name of the file the config was parsed from, for messages;
// "" for a Config built in code.
func (b *Built) File() string { return b.cfg.src }

// LabelKey is key_label_secret_file's secret, or nil without one.
func (b *Built) LabelKey() []byte { return b.labelKey }

// TrustedProxies are client_ip.trusted_proxies, parsed and masked.
func (b *Built) TrustedProxies() clientip.Trusted { return b.trusted }

// Allow is the allow list of rules[i], compiled.
func (b *Built) Allow(i int) *AllowSet { return &b.allow[i] }

// JWT holds the keys the jwt section's files hold (none without one).
func (b *Built) JWT() *JWTKeys { return &b.jwt }

// RLS is envoy_rls compiled: its domains' descriptor trees.
func (b *Built) RLS() *RLS { return &b.rls }

// Fleet is the fleet section compiled: its secret and Redis's options.
func (b *Built) Fleet() *FleetBuilt { return &b.fleet }

// WithFleet is b with f as its fleet section: a running fleet keeps the
// settings it started with, as they take a restart, while the rest of a
// reloaded config applies.
func (b *Built) WithFleet(f *FleetConfig) *Built {
	nb, cfg := *b, *b.cfg
	cfg.Fleet = f
	nb.cfg = &cfg
	return &nb
}

// Spec is the config as the engine compiles it: the rules' limits,
// budgets and caps, Envoy's descriptors' limits, the tarpit, the new-key
// defense and the sketches' size.
func (b *Built) Spec() *engine.Spec {
	c := b.cfg
	sp := &engine.Spec{
		Buckets: c.Sketch.Buckets, TwoChoice: c.Sketch.TwoChoice,
		Tarpit:  c.Tarpit.spec(),
		NewKeys: c.NewKeys.spec(),
	}
	for _, rc := range c.Rules {
		sp.Rules = append(sp.Rules, rc.spec())
	}
	if c.EnvoyRLS != nil {
		for _, rc := range b.rls.rules {
			sp.RLSRules = append(sp.RLSRules, rc.spec())
		}
	}
	return sp
}
