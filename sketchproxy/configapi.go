package sketchproxy

import (
	"reflect"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// The configuration lives in package config (sketchproxy/config): its
// types, defaults, checks and compilation. The names below keep this
// package's API as it was: each type is config's own, under its old name.

// The configuration reference is generated from config's types: their doc
// comments, their reload and example tags, and the defaults they take.
//go:generate go run ./internal/configref -o docs/configuration.md

// The configuration's types (package config).
type (
	Config            = config.Config
	ConfigError       = config.Error
	Duration          = config.Duration
	ServerConfig      = config.ServerConfig
	ClientIPConfig    = config.ClientIPConfig
	SketchConfig      = config.SketchConfig
	TarpitConfig      = config.TarpitConfig
	NewKeysConfig     = config.NewKeysConfig
	HeadersConfig     = config.HeadersConfig
	JWTConfig         = config.JWTConfig
	FleetConfig       = config.FleetConfig
	SentinelConfig    = config.SentinelConfig
	FleetTLS          = config.FleetTLS
	ForwardAuthConfig = config.ForwardAuthConfig
	EnvoyRLSConfig    = config.EnvoyRLSConfig
	RLSDomain         = config.RLSDomain
	RLSDescriptor     = config.RLSDescriptor
	RLSRateLimit      = config.RLSRateLimit
	RLSReplace        = config.RLSReplace
	RLSTLSConfig      = config.RLSTLSConfig
	Rule              = config.Rule
	Match             = config.Match
	AllowList         = config.AllowList
	Limit             = config.Limit
	Budget            = config.Budget
)

// The example configurations (config.ExampleConfig, ...): sketchproxy
// -example prints them.
const (
	ExampleConfig = config.ExampleConfig
	MinimalConfig = config.MinimalConfig
	DemoConfig    = config.DemoConfig
)

// LoadConfig reads and validates a YAML file (config.Load).
func LoadConfig(path string) (*Config, error) { return config.Load(path) }

// ParseConfig parses and validates YAML; name is used in messages
// (config.Parse). Unknown fields are errors (a typo must not silently
// disable a limit).
func ParseConfig(name string, data []byte) (*Config, error) { return config.Parse(name, data) }

// RestartOnly lists the settings, by their path in the file, that differ
// between the running config and next and that only a restart applies
// (config.RestartOnly).
func RestartOnly(running, next *Config) []string { return config.RestartOnly(running, next) }

// ReloadTag reads a field's reload tag: its kind ("" for a field a reload
// applies, "restart" or "restart-on-listen") and its note
// (config.ReloadTag).
func ReloadTag(f reflect.StructField) (kind, note string) { return config.ReloadTag(f) }

// The words of the config the doors act on.
const (
	sourceXFF       = config.SourceXFF
	sourceForwarded = config.SourceForwarded
	sourceRealIP    = config.SourceRealIP

	gatewayNginx   = config.GatewayNginx
	gatewayCaddy   = config.GatewayCaddy
	gatewayTraefik = config.GatewayTraefik

	rlsHeadersRateLimit = config.RLSHeadersRateLimit
	rlsHeadersDraft     = config.RLSHeadersDraft
)
