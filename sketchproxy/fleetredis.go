package sketchproxy

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// fleetOptions checks where the fleet's Redis is and how to reach it, and
// builds the client's options: one server, a Cluster or Sentinel, through
// go-redis's universal client.
func (c *Config) fleetOptions(fb *fleetBuilt) error {
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
	var urlPassword string
	useTLS := f.TLS != nil
	serverName := ""
	switch {
	case f.Redis != "" && strings.Contains(f.Redis, "://"):
		u, err := redis.ParseURL(f.Redis)
		if err != nil {
			return c.errAt(fmt.Sprintf("%v: want host:port, redis://[user[:password]@]host:port[/db] or rediss://...", err), "fleet", "redis")
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
			return c.errAt(fmt.Sprintf("%q: want host:port or a redis:// URL", f.Redis), "fleet", "redis")
		}
		o.Addrs = []string{f.Redis}
	case len(f.Cluster) > 0:
		for i, a := range f.Cluster {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return c.errAt(fmt.Sprintf("%q: want host:port", a), "fleet", "cluster", i)
			}
		}
		if f.DB != 0 {
			return c.errAt("Redis Cluster has only database 0", "fleet", "db")
		}
		o.Addrs, o.IsClusterMode = f.Cluster, true
	default:
		sn := f.Sentinel
		if sn.Master == "" || len(sn.Addrs) == 0 {
			return c.errAt("want master (the monitored master's name) and addrs (the sentinels)", "fleet", "sentinel")
		}
		o.Addrs, o.MasterName = sn.Addrs, sn.Master
		o.SentinelPassword = sn.Password
		if sn.PasswordEnv != "" {
			if sn.Password != "" {
				return c.errAt("give password or password_env, not both", "fleet", "sentinel")
			}
			o.SentinelPassword = os.Getenv(sn.PasswordEnv)
			if o.SentinelPassword == "" {
				return c.errAt(fmt.Sprintf("the environment variable %s is empty or unset", sn.PasswordEnv), "fleet", "sentinel", "password_env")
			}
		}
	}
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
	if useTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		if t := f.TLS; t != nil {
			if t.ServerName != "" {
				tc.ServerName = t.ServerName
			}
			if t.CAFile != "" {
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
			if t.CertFile != "" {
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
