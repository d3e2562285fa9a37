package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"
)

// FleetConfig makes N SketchProxy replicas enforce one limit through Redis
// (or Valkey), sharing only the elephants. See docs/fleets.md.
type FleetConfig struct {
	// Redis is one server: host:port, or a redis:// or rediss:// (TLS) URL
	// with an optional user, password and database, e.g.
	// rediss://sketchproxy@redis.internal:6380/2. Give Redis, Cluster or
	// Sentinel.
	Redis string `yaml:"redis" example:"\"rediss://sketchproxy@redis.internal:6380/0\""`
	// Cluster lists seed nodes (host:port) of a Redis Cluster.
	Cluster []string `yaml:"cluster" example:"[10.0.0.11:6379, 10.0.0.12:6379]"`
	// Sentinel finds the master through Redis Sentinel.
	Sentinel *SentinelConfig `yaml:"sentinel"`
	// Username is the ACL user (Redis 6 and later; default: the URL's, or
	// "default").
	Username string `yaml:"username" example:"sketchproxy"`
	// The password: from a file (PasswordFile, e.g. a mounted secret), an
	// environment variable (PasswordEnv), the URL, or Password in this
	// file; give at most one.
	Password     string `yaml:"password" example:"s3cret"`
	PasswordEnv  string `yaml:"password_env" example:"REDIS_PASSWORD"`
	PasswordFile string `yaml:"password_file" example:"/run/secrets/redis-password"`
	// DB is the database number (default: the URL's, or 0).
	DB int `yaml:"db" example:"2"`
	// TLS: a CA to verify the server with, a client certificate, and the
	// name to verify (default: the host). A rediss:// URL turns TLS on with
	// the system's CAs.
	TLS *FleetTLS `yaml:"tls"`
	// Secret keys the HMAC that hashes every key before it leaves the
	// process: Redis never sees a client address or an API key. At least 16
	// bytes, the same on every replica; or SecretFile.
	Secret     string `yaml:"secret" example:"\"a-per-deployment-secret-of-16-bytes-or-more\""`
	SecretFile string `yaml:"secret_file" example:"/etc/sketchproxy/fleet-secret"`
	// Replicas is N; 0 counts the replicas that heartbeat to Redis.
	Replicas int `yaml:"replicas" example:"3"`
	// MinReplicas is the fewest replicas N counts, when replicas is 0,
	// whether Redis answers or not (default: the most seen at once
	// lately, and 2 before any was seen; docs/fleets.md, How a replica
	// counts its peers): a replica that never heard from Redis, or whose
	// members a writer without the secret deletes, must not count itself
	// alone.
	MinReplicas int `yaml:"min_replicas" example:"3"`
	// ID names this replica in the heartbeat and in its record of each
	// hot key (default host-pid; no spaces). Each fleet started adds a
	// suffix of its own to it, so that two limiters in one process, or a
	// replica and its restart, never write each other's record.
	ID string `yaml:"id" example:"proxy-a"`
	// Interval between sync rounds (default 500ms); Timeout bounds a round
	// (default 250ms).
	Interval Duration `yaml:"interval" example:"500ms"`
	Timeout  Duration `yaml:"timeout" example:"250ms"`
	// PromoteFraction: a key whose local count would pass this fraction of
	// θ/N joins the hot set and is shared at once (default 0.5); it leaves
	// below a quarter of that. Where θ/N holds no whole request, every key
	// is shared from its first request.
	PromoteFraction float64 `yaml:"promote_fraction" example:"0.5"`
	// MaxHot bounds the hot set (default 10000): the keys one replica
	// shares at once; set it above twice the heavy keys one replica sees
	// at once. Past it, a key is decided alone at θ/N, warned once
	// (docs/fleets.md, Worst cases).
	MaxHot int `yaml:"max_hot" example:"10000"`
	// Prefix of the Redis keys (default "sketchproxy:").
	Prefix string `yaml:"prefix" example:"\"sketchproxy:\""`
	// WalletOnFailure: "closed" (default) refuses budget routes with 503
	// while Redis is unreachable; "local" enforces θ/N locally instead.
	WalletOnFailure string `yaml:"wallet_on_failure" example:"local"`
}

// FleetBuilt is what validating a fleet section reads and builds: the
// secret keys are hashed with, and the options of the Redis client.
type FleetBuilt struct {
	secret []byte
	opts   *redis.UniversalOptions
	// offline checks the section without reading its files or the
	// environment (CheckFleet: a config written where its secrets are
	// not); what they hold is checked when the fleet starts.
	offline bool
}

// Secret is the fleet's secret, from secret or secret_file: every key is
// HMACed with it before it reaches Redis.
func (fb *FleetBuilt) Secret() []byte { return fb.secret }

// RedisOptions are the options of the fleet's Redis client (one server, a
// Cluster or Sentinel), for redis.NewUniversalClient; nil without a fleet.
func (fb *FleetBuilt) RedisOptions() *redis.UniversalOptions { return fb.opts }

// BuildFleet checks cfg as a config file's fleet section is checked (the
// same defaults and messages: an *Error naming the field, such as
// fleet.secret), reading its files and environment variables, for a fleet
// started outside a Config (the Caddy module's). It returns a copy of cfg
// with its defaults applied; cfg is not changed.
func BuildFleet(cfg *FleetConfig) (*FleetConfig, *FleetBuilt, error) {
	c := (&Config{Fleet: cfg}).clone()
	var fb FleetBuilt
	if err := c.validateFleet(&fb); err != nil {
		return nil, nil, err
	}
	return c.Fleet, &fb, nil
}

// CheckFleet checks cfg as BuildFleet does, without reading its files or
// environment variables (what they hold is checked when the fleet
// starts): for a config written where its secrets are not, as a
// Caddyfile is adapted. cfg is not changed.
func CheckFleet(cfg *FleetConfig) error {
	c := (&Config{Fleet: cfg}).clone()
	return c.validateFleet(&FleetBuilt{offline: true})
}

// SentinelConfig is a Redis Sentinel deployment: the master's name and the
// sentinels' addresses.
type SentinelConfig struct {
	// Master is the name the sentinels know the master by.
	Master string `yaml:"master" example:"mymaster"`
	// Addrs are the sentinels' addresses (host:port).
	Addrs []string `yaml:"addrs" example:"[10.0.0.21:26379, 10.0.0.22:26379]"`
	// Password of the sentinels themselves, if they require one (or
	// PasswordEnv).
	Password string `yaml:"password" example:"s3cret"`
	// PasswordEnv names the environment variable that holds the
	// sentinels' password, rather than writing it in the file.
	PasswordEnv string `yaml:"password_env" example:"SENTINEL_PASSWORD"`
}

// FleetTLS is the TLS of the connection to Redis.
type FleetTLS struct {
	// CAFile holds the CAs that verify Redis's certificate (PEM; default:
	// the system's).
	CAFile string `yaml:"ca_file" example:"/etc/sketchproxy/redis-ca.pem"`
	// CertFile and KeyFile are this replica's client certificate and its
	// key (PEM), for Redis servers that ask for one.
	CertFile string `yaml:"cert_file" example:"/etc/sketchproxy/client.pem"`
	KeyFile  string `yaml:"key_file" example:"/etc/sketchproxy/client.key"`
	// ServerName is the name Redis's certificate must carry (default: the
	// host).
	ServerName string `yaml:"server_name" example:"redis.internal"`
}

func (c *Config) validateFleet(fb *FleetBuilt) error {
	f := c.Fleet
	if f == nil {
		return nil
	}
	switch {
	case f.Secret != "" && f.SecretFile != "":
		return c.errAt("give secret or secret_file, not both", "fleet")
	case f.SecretFile != "" && fb.offline:
		fb.secret = make([]byte, 16) // its length is checked once read
	case f.SecretFile != "":
		b, err := os.ReadFile(f.SecretFile)
		if err != nil {
			return c.errAt(err.Error(), "fleet", "secret_file")
		}
		fb.secret = []byte(strings.TrimSpace(string(b)))
	default:
		fb.secret = []byte(f.Secret)
	}
	if len(fb.secret) < 16 && f.SecretFile != "" && !fb.offline {
		return c.errAt(fmt.Sprintf("%s holds %d bytes (spaces and newlines at its ends trimmed): the fleet's secret needs at least 16, e.g. openssl rand -hex 32 > %s", f.SecretFile, len(fb.secret), f.SecretFile), "fleet", "secret_file")
	}
	if len(fb.secret) < 16 {
		return c.errAt("a per-deployment secret of at least 16 bytes is required (secret or secret_file): keys are hashed with it before they reach Redis", "fleet", "secret")
	}
	if f.Replicas < 0 || f.Replicas > 1000 {
		return c.errAt(fmt.Sprintf("%d: want 0 (count heartbeats) to 1000", f.Replicas), "fleet", "replicas")
	}
	if f.MinReplicas < 0 || f.MinReplicas > 1000 {
		return c.errAt(fmt.Sprintf("%d: want 0 (the default) to 1000", f.MinReplicas), "fleet", "min_replicas")
	}
	if f.ID == "" {
		h, _ := os.Hostname()
		f.ID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if strings.ContainsFunc(f.ID, unicode.IsSpace) || len(f.ID) > 200 {
		return c.errAt(fmt.Sprintf("%q: at most 200 bytes, no spaces: it names this replica's record of each key in Redis", f.ID), "fleet", "id")
	}
	if f.Interval == 0 {
		f.Interval = Duration(500 * time.Millisecond)
	}
	if f.Timeout == 0 {
		f.Timeout = Duration(250 * time.Millisecond)
	}
	if f.Interval < Duration(10*time.Millisecond) || f.Interval > Duration(time.Minute) {
		return c.errAt("want 10ms to 1m", "fleet", "interval")
	}
	if f.Timeout <= 0 || f.Timeout > f.Interval*4 {
		return c.errAt("want more than 0 and at most 4 intervals", "fleet", "timeout")
	}
	if f.PromoteFraction == 0 {
		f.PromoteFraction = 0.5
	}
	if f.PromoteFraction <= 0 || f.PromoteFraction > 1 {
		return c.errAt(fmt.Sprintf("%g: want more than 0 and at most 1", f.PromoteFraction), "fleet", "promote_fraction")
	}
	if f.MaxHot == 0 {
		f.MaxHot = 10000
	}
	if f.MaxHot < 1 || f.MaxHot > 1<<20 {
		return c.errAt("want 1 to 2^20", "fleet", "max_hot")
	}
	if f.Prefix == "" {
		f.Prefix = "sketchproxy:"
	}
	if strings.ContainsAny(f.Prefix, "{}") {
		return c.errAt(fmt.Sprintf("%q: no { or }: the keys' hash tags follow the prefix", f.Prefix), "fleet", "prefix")
	}
	switch f.WalletOnFailure {
	case "":
		f.WalletOnFailure = "closed"
	case "closed", "local":
	default:
		return c.errAt(fmt.Sprintf("%q: want closed or local", f.WalletOnFailure), "fleet", "wallet_on_failure")
	}
	return c.fleetOptions(fb)
}

// fleetOptions checks where the fleet's Redis is and how to reach it, and
// builds the client's options: one server, a Cluster or Sentinel, through
// go-redis's universal client.
func (c *Config) fleetOptions(fb *FleetBuilt) error {
	f := c.Fleet
	given := 0
	for _, b := range []bool{f.Redis != "", len(f.Cluster) > 0, f.Sentinel != nil} {
		if b {
			given++
		}
	}
	if given != 1 {
		return c.errAt("say where Redis is with exactly one of redis (host:port or a redis:// URL), cluster (seed nodes) or sentinel", "fleet")
	}
	o := &redis.UniversalOptions{Username: f.Username, DB: f.DB}
	urlPassword, useTLS, serverName, err := c.fleetAddrs(fb, o)
	if err != nil {
		return err
	}
	if err := c.fleetPassword(fb, o, urlPassword); err != nil {
		return err
	}
	if useTLS {
		if err := c.fleetTLS(fb, o, serverName); err != nil {
			return err
		}
	}
	to := time.Duration(f.Timeout)
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = to, to, to
	o.MaxRetries, o.PoolSize = -1, 4
	if o.IsClusterMode {
		o.MaxRedirects = 3 // MOVED and ASK during a failover or resharding
	}
	fb.opts = o
	return nil
}

// fleetAddrs sets where o finds Redis (one server, a Cluster's seed nodes
// or Sentinel), from the fleet's redis, cluster or sentinel; a redis://
// URL may also give the password, and rediss:// TLS with its server name.
func (c *Config) fleetAddrs(fb *FleetBuilt, o *redis.UniversalOptions) (urlPassword string, useTLS bool, serverName string, err error) {
	f := c.Fleet
	useTLS = f.TLS != nil
	switch {
	case f.Redis != "" && strings.Contains(f.Redis, "://"):
		u, err := redis.ParseURL(f.Redis)
		if err != nil {
			return "", false, "", c.errAt(fmt.Sprintf("%v: want host:port, redis://[user[:password]@]host:port[/db] or rediss://...", err), "fleet", "redis")
		}
		o.Addrs = []string{u.Addr}
		if o.Username == "" {
			o.Username = u.Username
		}
		urlPassword = u.Password
		if f.DB == 0 {
			o.DB = u.DB
		}
		if u.TLSConfig != nil {
			useTLS, serverName = true, u.TLSConfig.ServerName
		}
	case f.Redis != "":
		if _, _, err := net.SplitHostPort(f.Redis); err != nil {
			return "", false, "", c.errAt(fmt.Sprintf("%q: want host:port or a redis:// URL", f.Redis), "fleet", "redis")
		}
		o.Addrs = []string{f.Redis}
	case len(f.Cluster) > 0:
		for i, a := range f.Cluster {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return "", false, "", c.errAt(fmt.Sprintf("%q: want host:port", a), "fleet", "cluster", i)
			}
		}
		if f.DB != 0 {
			return "", false, "", c.errAt("Redis Cluster has only database 0", "fleet", "db")
		}
		o.Addrs, o.IsClusterMode = f.Cluster, true
	default:
		sn := f.Sentinel
		if sn.Master == "" || len(sn.Addrs) == 0 {
			return "", false, "", c.errAt("want master (the monitored master's name) and addrs (the sentinels)", "fleet", "sentinel")
		}
		o.Addrs, o.MasterName = sn.Addrs, sn.Master
		o.SentinelPassword = sn.Password
		if sn.PasswordEnv != "" {
			if sn.Password != "" {
				return "", false, "", c.errAt("give password or password_env, not both", "fleet", "sentinel")
			}
			o.SentinelPassword = os.Getenv(sn.PasswordEnv)
			if o.SentinelPassword == "" && !fb.offline {
				return "", false, "", c.errAt(fmt.Sprintf("the environment variable %s is empty or unset", sn.PasswordEnv), "fleet", "sentinel", "password_env")
			}
		}
	}
	return urlPassword, useTLS, serverName, nil
}

// fleetPassword sets o's password from its one source: password,
// password_env, password_file or the URL's.
func (c *Config) fleetPassword(fb *FleetBuilt, o *redis.UniversalOptions, urlPassword string) error {
	f := c.Fleet
	// The password: at most one source.
	sources := 0
	for _, s := range []string{f.Password, f.PasswordEnv, f.PasswordFile, urlPassword} {
		if s != "" {
			sources++
		}
	}
	if sources > 1 {
		return c.errAt("the password is given more than once: use one of password_file, password_env, the URL or password", "fleet")
	}
	o.Password = f.Password + urlPassword
	switch {
	case fb.offline:
	case f.PasswordEnv != "":
		if o.Password = os.Getenv(f.PasswordEnv); o.Password == "" {
			return c.errAt(fmt.Sprintf("the environment variable %s is empty or unset", f.PasswordEnv), "fleet", "password_env")
		}
	case f.PasswordFile != "":
		b, err := os.ReadFile(f.PasswordFile)
		if err != nil {
			return c.errAt(err.Error(), "fleet", "password_file")
		}
		if o.Password = strings.TrimRight(string(b), "\r\n"); o.Password == "" {
			return c.errAt(fmt.Sprintf("%s is empty", f.PasswordFile), "fleet", "password_file")
		}
	}
	return nil
}

// fleetTLS sets o's TLS from the fleet's tls (its CA, client certificate
// and server name), the server name otherwise the URL's or the address's.
func (c *Config) fleetTLS(fb *FleetBuilt, o *redis.UniversalOptions, serverName string) error {
	f := c.Fleet
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if t := f.TLS; t != nil {
		if t.ServerName != "" {
			tc.ServerName = t.ServerName
		}
		if t.CAFile != "" && !fb.offline {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return c.errAt(err.Error(), "fleet", "tls", "ca_file")
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return c.errAt(fmt.Sprintf("%s holds no PEM certificate", t.CAFile), "fleet", "tls", "ca_file")
			}
		}
		if (t.CertFile == "") != (t.KeyFile == "") {
			return c.errAt("give cert_file and key_file together", "fleet", "tls")
		}
		if t.CertFile != "" && !fb.offline {
			cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return c.errAt(err.Error(), "fleet", "tls", "cert_file")
			}
			tc.Certificates = []tls.Certificate{cert}
		}
	}
	if tc.ServerName == "" && len(o.Addrs) == 1 && !o.IsClusterMode && o.MasterName == "" {
		tc.ServerName, _, _ = net.SplitHostPort(o.Addrs[0])
	}
	o.TLSConfig = tc
	return nil
}
