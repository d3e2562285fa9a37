package config

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"
)

// handKeptRestartOnly is the list cmd/sketchproxy kept by hand before the
// reload tag (commit 750ebd5, cmd/sketchproxy/main.go): the tag must name
// the same settings, with the same words, in the same order.
func handKeptRestartOnly(running, next *Config) []string {
	var stay []string
	diff := func(name string, a, b any) {
		if a != b {
			stay = append(stay, name)
		}
	}
	diff("listen", running.Listen, next.Listen)
	diff("admin", running.Admin, next.Admin)
	diff("upstream", running.Upstream, next.Upstream)
	diff("state_file", running.StateFile, next.StateFile)
	diff("state_every", running.StateEvery, next.StateEvery)
	diff("server.read_header_timeout", running.Server.ReadHeaderTimeout, next.Server.ReadHeaderTimeout)
	diff("server.idle_timeout", running.Server.IdleTimeout, next.Server.IdleTimeout)
	diff("server.max_header_bytes", running.Server.MaxHeaderBytes, next.Server.MaxHeaderBytes)
	diff("server.upstream_timeout", running.Server.UpstreamTimeout, next.Server.UpstreamTimeout)
	faListen := func(c *Config) string {
		if c.ForwardAuth == nil {
			return ""
		}
		return c.ForwardAuth.Listen
	}
	diff("forward_auth.listen", faListen(running), faListen(next))
	faPath := func(c *Config) string {
		if c.ForwardAuth == nil || c.ForwardAuth.Listen != "" {
			return ""
		}
		return c.ForwardAuth.Path
	}
	if p := faPath(running); p != "" && p != faPath(next) {
		stay = append(stay, "forward_auth.path (the old path stays the check's on listen)")
	}
	rlsListen := func(c *Config) string {
		if c.EnvoyRLS == nil {
			return ""
		}
		return c.EnvoyRLS.Listen
	}
	diff("envoy_rls.listen", rlsListen(running), rlsListen(next))
	rlsWatch := func(c *Config) Duration {
		if c.EnvoyRLS == nil {
			return 0
		}
		return c.EnvoyRLS.WatchEvery
	}
	diff("envoy_rls.watch_every", rlsWatch(running), rlsWatch(next))
	rlsTLS := func(c *Config) RLSTLSConfig {
		if c.EnvoyRLS == nil || c.EnvoyRLS.TLS == nil {
			return RLSTLSConfig{}
		}
		return *c.EnvoyRLS.TLS
	}
	diff("envoy_rls.tls (its files' contents reload by themselves)", rlsTLS(running), rlsTLS(next))
	return stay
}

// reloadChanges are the changes TestRestartOnlyFromTags pairs: one
// setting each, restart-only or not ("(loads)": a reload applies it).
func reloadChanges() map[string]func(*Config) {
	return map[string]func(*Config){
		"listen":               func(c *Config) { c.Listen = ":1" },
		"admin":                func(c *Config) { c.Admin = "off" },
		"upstream":             func(c *Config) { c.Upstream = "http://u:2" },
		"state file":           func(c *Config) { c.StateFile = "/s" },
		"state every":          func(c *Config) { c.StateEvery *= 2 },
		"read header timeout":  func(c *Config) { c.Server.ReadHeaderTimeout++ },
		"idle timeout":         func(c *Config) { c.Server.IdleTimeout++ },
		"max header bytes":     func(c *Config) { c.Server.MaxHeaderBytes++ },
		"upstream timeout":     func(c *Config) { c.Server.UpstreamTimeout++ },
		"body timeout (loads)": func(c *Config) { c.Server.BodyTimeout++ },
		"buffer (loads)":       func(c *Config) { c.Server.BufferBody = ptr(1) },
		"source (loads)":       func(c *Config) { c.ClientIP.Source = "forwarded" },
		"rules (load)":         func(c *Config) { c.Rules = append(c.Rules, Rule{Name: "x"}) },
		"no check":             func(c *Config) { c.ForwardAuth = nil },
		"check path": func(c *Config) {
			c.ForwardAuth = &ForwardAuthConfig{Path: "/other"}
		},
		"check moved": func(c *Config) {
			c.ForwardAuth = &ForwardAuthConfig{Path: "/check", Listen: ":10"}
		},
		"check status (loads)": func(c *Config) {
			c.ForwardAuth = &ForwardAuthConfig{Path: "/check", RefusalStatus: 403}
		},
		"no envoy": func(c *Config) { c.EnvoyRLS = nil },
		"envoy listen": func(c *Config) {
			c.EnvoyRLS = &EnvoyRLSConfig{Listen: ":8082", WatchEvery: Duration(time.Second)}
		},
		"envoy watch": func(c *Config) {
			c.EnvoyRLS = &EnvoyRLSConfig{Listen: ":8081", WatchEvery: Duration(time.Minute)}
		},
		"envoy client ca": func(c *Config) {
			c.EnvoyRLS = &EnvoyRLSConfig{Listen: ":8081", WatchEvery: Duration(time.Second), TLS: &RLSTLSConfig{CertFile: "c.pem", KeyFile: "k.pem", ClientCAFile: "ca.pem"}}
		},
		"envoy headers (load)": func(c *Config) {
			c.EnvoyRLS = &EnvoyRLSConfig{Listen: ":8081", WatchEvery: Duration(time.Second), TLS: &RLSTLSConfig{CertFile: "c.pem", KeyFile: "k.pem"}, ResponseHeaders: "draft"}
		},
	}
}

// RestartOnly, read from the fields' reload tags, names what the hand-kept
// list named, for every pair of configs that differ in one or two
// settings, restart-only or not, with each optional section absent, on
// the main listener or on its own.
func TestRestartOnlyFromTags(t *testing.T) {
	bases := map[string]func(*Config){
		"bare": func(*Config) {},
		"check on listen": func(c *Config) {
			c.ForwardAuth = &ForwardAuthConfig{Path: "/check"}
		},
		"check on its own": func(c *Config) {
			c.ForwardAuth = &ForwardAuthConfig{Path: "/check", Listen: ":9"}
		},
		"envoy with tls": func(c *Config) {
			c.EnvoyRLS = &EnvoyRLSConfig{Listen: ":8081", WatchEvery: Duration(time.Second), TLS: &RLSTLSConfig{CertFile: "c.pem", KeyFile: "k.pem"}}
		},
	}
	changes := reloadChanges()
	build := func(base func(*Config), more ...func(*Config)) *Config {
		c := &Config{Listen: ":8080", Admin: "127.0.0.1:9091", StateEvery: Duration(time.Minute),
			Server: ServerConfig{ReadHeaderTimeout: Duration(10 * time.Second), IdleTimeout: Duration(2 * time.Minute), MaxHeaderBytes: 65536}}
		base(c)
		for _, f := range more {
			f(c)
		}
		return c
	}
	fleetA, fleetB := &Config{Fleet: &FleetConfig{Redis: "r:1"}}, &Config{Fleet: &FleetConfig{Redis: "r:2"}}
	if got := RestartOnly(fleetA, fleetB); !slices.Equal(got, []string{"fleet"}) {
		t.Errorf("another fleet.redis: RestartOnly %q, want [fleet]: the reload keeps the running fleet", got)
	}
	named := 0
	for bn, base := range bases {
		for cn, change := range changes {
			for dn, second := range changes {
				a, b := build(base), build(base, change, second)
				for _, pair := range [][2]*Config{{a, b}, {b, a}} {
					want, got := handKeptRestartOnly(pair[0], pair[1]), RestartOnly(pair[0], pair[1])
					if !slices.Equal(got, want) {
						t.Errorf("%s, then %s and %s: RestartOnly %q, the hand-kept list %q", bn, cn, dn, got, want)
					}
					named += len(want)
				}
			}
		}
	}
	if named < 1000 {
		t.Fatalf("the pairs named %d settings in all: the changes no longer touch restart-only settings", named)
	}
}

// Every field tagged reload is one a file can set, and its tag is one
// RestartOnly knows: a misspelt tag would make a restart-only setting
// reload silently.
func TestReloadTags(t *testing.T) {
	n := 0
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type, string)
	walk = func(tp reflect.Type, path string) {
		for i := range tp.NumField() {
			f := tp.Field(i)
			kind, _ := ReloadTag(f)
			switch kind {
			case "":
			case reloadRestart, reloadRestartOnMain:
				n++
				if yamlName(f) == "" {
					t.Errorf("%s.%s: tagged reload but the file cannot set it", path, f.Name)
				}
			default:
				t.Errorf("%s.%s: reload:%q: want restart or restart-on-listen", path, f.Name, kind)
			}
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && kind == "" && f.IsExported() && !seen[ft] {
				seen[ft] = true
				walk(ft, fmt.Sprintf("%s.%s", path, f.Name))
			}
		}
	}
	walk(reflect.TypeFor[Config](), "Config")
	if n != 22 {
		t.Errorf("%d fields tagged reload, want the 14 cmd/sketchproxy's hand-kept list named, fleet, key_label_secret_file, envoy_rls.max_connection_age and its grace, and envoy_rls's connection_timeout, max_connection_idle, max_connections and max_connections_per_client", n)
	}
}
