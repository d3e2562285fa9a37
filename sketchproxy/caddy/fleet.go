package caddyepochsketch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap/exp/zapslog"

	"github.com/epochsketch/epochsketch"
	spconfig "github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/fleet"
)

// Distributed counts: SketchProxy's fleet (sketchproxy/internal/fleet,
// docs/fleets.md) under the handler's zones, so that N Caddys enforce
// one limit through Redis, sharing only the keys heavy enough to matter.
//
// A fleet belongs to an engine (engine.Options.Fleet), so handlers with a
// fleet decide in an engine of their own: one per fleet setting, pooled by
// the settings as the zones are pooled by their definition. Handlers whose
// settings are equal share the engine and its one fleet (one hot set, one
// heartbeat, one connection pool); a reload that keeps the settings keeps
// both, and with them the zones' counts; the last config that uses them
// stops the fleet. Handlers without a fleet keep the process's engine.
//
// The fleet names each count in Redis by HMAC(secret, rule, limit, key).
// Two zones of one name in two places must not meet there (they count
// apart in one Caddy), and a zone must meet itself on every replica
// running the same Caddyfile: in a fleet's engine a zone's rule is named
// by its name and a hash of what the zone pool knows it by (its place or
// shared, its definition, its order among identical zones), none of which
// depends on the replica (ports, process, host). Changing a zone's
// definition renames its rule: replicas still on the old definition do
// not mix their counts with the new one's.

// Fleet is the handler's fleet: SketchProxy's fleet settings (FleetConfig),
// with its names. Equal settings in several handlers are one fleet.
type Fleet struct {
	// Redis is one server: host:port, or a redis:// or rediss:// (TLS)
	// URL with an optional user, password and database. Give Redis,
	// Cluster or Sentinel.
	Redis string `json:"redis,omitempty"`
	// Cluster lists seed nodes (host:port) of a Redis Cluster.
	Cluster []string `json:"cluster,omitempty"`
	// Sentinel finds the master through Redis Sentinel.
	Sentinel *FleetSentinel `json:"sentinel,omitempty"`
	// Username is the ACL user (default: the URL's, or "default").
	Username string `json:"username,omitempty"`
	// The password: from one of Password, PasswordEnv (an environment
	// variable), PasswordFile (trailing newlines dropped) or the URL.
	Password     string `json:"password,omitempty"`
	PasswordEnv  string `json:"password_env,omitempty"`
	PasswordFile string `json:"password_file,omitempty"`
	// DB is the database number (default: the URL's, or 0).
	DB int `json:"db,omitempty"`
	// TLS of the connection to Redis (a rediss:// URL turns it on with
	// the system's CAs).
	TLS *FleetTLS `json:"tls,omitempty"`
	// Secret keys the HMAC that hashes every key before it leaves Caddy:
	// at least 16 bytes, the same on every replica; or SecretFile.
	Secret     string `json:"secret,omitempty"`
	SecretFile string `json:"secret_file,omitempty"`
	// Replicas is N; 0 counts the replicas that heartbeat to Redis.
	Replicas int `json:"replicas,omitempty"`
	// MinReplicas is the fewest Caddys N counts when replicas is 0,
	// whether Redis answers or not (default: the most seen lately; 2
	// before any).
	MinReplicas int `json:"min_replicas,omitempty"`
	// ID names this replica in Redis (default host-pid).
	ID string `json:"id,omitempty"`
	// Interval between sync rounds (default 500ms); Timeout bounds a
	// round (default 250ms).
	Interval caddy.Duration `json:"interval,omitempty"`
	Timeout  caddy.Duration `json:"timeout,omitempty"`
	// PromoteFraction of θ/N past which a key is shared (default 0.5).
	PromoteFraction float64 `json:"promote_fraction,omitempty"`
	// MaxHot bounds the keys shared at once (default 10000); past it a key
	// is decided alone at θ/N, warned once.
	MaxHot int `json:"max_hot,omitempty"`
	// Prefix of the Redis keys and the claims channel (default
	// "epochsketch:").
	Prefix string `json:"prefix,omitempty"`
}

// FleetSentinel is a Redis Sentinel deployment.
type FleetSentinel struct {
	Master      string   `json:"master,omitempty"`
	Addrs       []string `json:"addrs,omitempty"`
	Password    string   `json:"password,omitempty"`
	PasswordEnv string   `json:"password_env,omitempty"`
}

// FleetTLS is the TLS of the connection to Redis.
type FleetTLS struct {
	CAFile     string `json:"ca_file,omitempty"`
	CertFile   string `json:"cert_file,omitempty"`
	KeyFile    string `json:"key_file,omitempty"`
	ServerName string `json:"server_name,omitempty"`
}

// defaultPrefix is the module's prefix of its Redis keys: not
// SketchProxy's own, since N counts every process that heartbeats under a
// prefix, and SketchProxy's replicas on the same Redis are no replicas of
// these Caddys.
const defaultPrefix = "epochsketch:"

// config is f as SketchProxy's FleetConfig. The module's zones have no
// wallets, so wallet_on_failure has nothing to say here.
func (f *Fleet) config() *spconfig.FleetConfig {
	c := &spconfig.FleetConfig{
		Redis: f.Redis, Cluster: slices.Clone(f.Cluster),
		Username: f.Username, Password: f.Password, PasswordEnv: f.PasswordEnv, PasswordFile: f.PasswordFile,
		DB: f.DB, Secret: f.Secret, SecretFile: f.SecretFile, Replicas: f.Replicas, MinReplicas: f.MinReplicas, ID: f.ID,
		Interval: spconfig.Duration(f.Interval), Timeout: spconfig.Duration(f.Timeout),
		PromoteFraction: f.PromoteFraction, MaxHot: f.MaxHot, Prefix: cmp.Or(f.Prefix, defaultPrefix),
	}
	if s := f.Sentinel; s != nil {
		c.Sentinel = &spconfig.SentinelConfig{Master: s.Master, Addrs: slices.Clone(s.Addrs), Password: s.Password, PasswordEnv: s.PasswordEnv}
	}
	if t := f.TLS; t != nil {
		c.TLS = &spconfig.FleetTLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName}
	}
	return c
}

// check checks f as SketchProxy checks a fleet section, in its words
// ("fleet.secret: ..."), reading no file and no environment variable: a
// config may be adapted or validated where its secrets are not. Starting
// the fleet reads them.
func (f *Fleet) check() error {
	return spconfig.CheckFleet(f.config())
}

// The pool of fleets: one engine and its fleet per fleet setting.
var fleets = caddy.NewUsagePool()

// fleetState is a fleet in the pool: its engine and how to stop its sync.
type fleetState struct {
	key  string
	eng  *engine.Engine
	stop func()
}

// Destruct stops the fleet once no config uses it; its decisions stay in
// the metrics.
func (f *fleetState) Destruct() error {
	retireEngine(f.eng)
	f.stop()
	return nil
}

func (f *fleetState) release() { fleets.Delete(f.key) }

// takeFleet holds the engine and fleet for f's settings (a test's clock
// and seed give it one of its own), starting them if no config holds them.
func takeFleet(f *Fleet, clock epochsketch.Clock, seed uint64) (*fleetState, error) {
	js, err := json.Marshal(f)
	if err != nil {
		return nil, fmt.Errorf("epochsketch: fleet: %v", err)
	}
	sum := sha256.Sum256(js)
	key := "fleet " + hex.EncodeToString(sum[:])
	if clock != nil || seed != 0 {
		key += fmt.Sprintf(" %p %d", clock, seed)
	}
	v, _, err := fleets.LoadOrNew(key, func() (caddy.Destructor, error) {
		var now func() time.Time
		if clock != nil {
			now = clock.Now
		}
		fl, err := fleet.Open(f.config(), slog.New(caddyLog{}), now)
		if err != nil {
			return nil, fmt.Errorf("epochsketch: %w", err)
		}
		eng := engine.New(engine.Options{Clock: clock, Seed: seed, Fleet: fl})
		addEngine(eng)
		return &fleetState{key: key, eng: eng, stop: fl.Close}, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*fleetState), nil
}

// fleetRule is the name of a zone's rule in a fleet's engine: the zone's
// name, '@' (no zone name holds one) and a hash of its identity in the
// zone pool, less the engine (which holds this replica's own settings,
// such as its id).
func fleetRule(name, identity string) string {
	sum := sha256.Sum256([]byte(identity))
	return name + "@" + hex.EncodeToString(sum[:6])
}

// zoneOf is the zone a rule decides for: its name without a fleet's hash.
func zoneOf(rule string) string {
	zone, _, _ := strings.Cut(rule, "@")
	return zone
}

// caddyLog writes the fleet's log records (Redis lost or back, claims not
// heard) through Caddy's default logger as it is at each record: the
// fleet outlives the config that started it, whose own loggers close
// with that config.
type caddyLog struct{ attrs []slog.Attr }

func (h caddyLog) handler() slog.Handler {
	zh := zapslog.NewHandler(caddy.Log().Core(), zapslog.WithName("http.handlers.epochsketch.fleet"))
	if len(h.attrs) == 0 {
		return zh
	}
	return zh.WithAttrs(h.attrs)
}

func (h caddyLog) Enabled(ctx context.Context, l slog.Level) bool {
	return h.handler().Enabled(ctx, l)
}

func (h caddyLog) Handle(ctx context.Context, r slog.Record) error {
	return h.handler().Handle(ctx, r)
}

func (h caddyLog) WithAttrs(as []slog.Attr) slog.Handler {
	return caddyLog{attrs: append(slices.Clip(h.attrs), as...)}
}

// WithGroup is not needed by the fleet, which logs no groups: records keep
// their attributes ungrouped.
func (h caddyLog) WithGroup(string) slog.Handler { return h }
