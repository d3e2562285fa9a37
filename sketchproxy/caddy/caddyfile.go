package caddyepochsketch

import (
	"errors"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	spconfig "github.com/epochsketch/epochsketch/sketchproxy/config"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("epochsketch", parseCaddyfile)
	// Where caddy-ratelimit asks its users to order rate_limit: before
	// basic_auth, so that a refused request reaches neither the
	// authentication (no password guessing past the limit) nor any of the
	// handlers ordered after it: handle, handle_path, route, respond,
	// reverse_proxy, file_server. Rewrites (rewrite, uri, try_files) come
	// first, so zones' matchers see the rewritten request, as every
	// handler after them does. "order epochsketch ..." in the global
	// options moves it. A zone keyed by what authentication sets is
	// refused where authentication runs after it (order.go, laterAuth):
	// it goes after the authentication in a route block.
	httpcaddyfile.RegisterDirectiveOrder("epochsketch", httpcaddyfile.Before, "basic_auth")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var hd Handler
	err := hd.UnmarshalCaddyfile(h.Dispenser)
	return &hd, err
}

// UnmarshalCaddyfile reads the directive (README.md has the whole page):
//
//	epochsketch [<matcher>] {
//		zone <name> {
//			key    <placeholders>
//			events <n>
//			window <duration>
//			burst  <n>
//			match  {
//				<matchers...>
//			}
//			shared
//		}
//		sketch_buckets <n>
//		new_keys off
//		jitter  <fraction>
//		log_key
//		fleet {
//			redis <host:port|url> | cluster <host:port...> | sentinel <master> <host:port...>
//			secret <secret> | secret_file <path>
//			...
//		}
//	}
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	at := here(d)
	if d.NextArg() {
		return d.Errf("epochsketch takes a matcher and a block, not %q: write epochsketch [<matcher>] { zone <name> { ... } }", d.Val())
	}
	for d.NextBlock(0) {
		sub := d.Val()
		switch sub {
		case "zone":
			if err := h.unmarshalZone(d); err != nil {
				return err
			}
			continue
		case "fleet":
			if h.Fleet != nil {
				return d.Errf("fleet is given twice in this directive: one fleet decides all its zones")
			}
			f, err := unmarshalFleet(d)
			if err != nil {
				return err
			}
			h.Fleet = f
			continue
		case "sketch_buckets":
			v, err := oneArg(d, sub, bucketsWant)
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > maxBuckets {
				return d.Errf("sketch_buckets %q: want %s", v, bucketsWant)
			}
			h.SketchBuckets = n
		case "new_keys":
			v, err := oneArg(d, sub, "off (the only setting: new_keys off)")
			if err != nil {
				return err
			}
			if v != "off" {
				return d.Errf("new_keys %q: the one setting is new_keys off", v)
			}
			h.NewKeysOff = true
		case "jitter":
			v, err := oneArg(d, sub, "a fraction from 0 to 1, e.g. jitter 0.2")
			if err != nil {
				return err
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f >= 0 && f <= 1) {
				return d.Errf("jitter %q: want a fraction from 0 to 1, e.g. jitter 0.2 (Retry-After up to 20%% longer)", v)
			}
			h.Jitter = f
		case "log_key":
			if d.NextArg() {
				return d.Errf("log_key takes no value: write log_key alone")
			}
			h.LogKey = true
		default:
			return d.Errf("unrecognized subdirective %q: want zone, sketch_buckets, new_keys, jitter, log_key or fleet", sub)
		}
		if d.NextArg() {
			return d.Errf("%s: one value only, not also %q", sub, d.Val())
		}
	}
	if len(h.Zones) == 0 {
		return at.Errf("no zones: add at least one with a key, events and a window, e.g.\n%s", zoneExample("per_ip"))
	}
	return nil
}

// bucketsWant is what sketch_buckets takes: any count of buckets (the
// sketch needs no power of two), up to maxBuckets.
const bucketsWant = "a number of 64-byte buckets from 1 to 67108864 (4 GiB), e.g. sketch_buckets 65536 (4 MiB)"

// maxBuckets is the most buckets a zone's sketch may have.
const maxBuckets = 1 << 26

// here is a dispenser on d's current token alone: its Errf names that
// token's file and line after the cursor of d has moved on (a zone's
// mistake found at its closing brace is reported at its name).
func here(d *caddyfile.Dispenser) *caddyfile.Dispenser {
	at := caddyfile.NewDispenser([]caddyfile.Token{d.Token()})
	at.Next()
	return at
}

// zoneExample is a zone block as it is written, for error messages.
func zoneExample(name string) string {
	return "\tzone " + name + " {\n\t\tkey {remote_host}\n\t\tevents 5\n\t\twindow 10s\n\t}"
}

// oneArg reads a subdirective's value, or says what to write.
func oneArg(d *caddyfile.Dispenser, sub, want string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("%s: want %s", sub, want)
	}
	return d.Val(), nil
}

// unmarshalZone reads one zone block, the dispenser on its "zone" token.
func (h *Handler) unmarshalZone(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("zone: want a name, e.g. zone per_ip { ... }")
	}
	name := d.Val()
	at := here(d)
	if !reName.MatchString(name) {
		return d.Errf("zone %q: name: use 1 to 64 letters, digits, - and _, e.g. zone per_ip", name)
	}
	if d.NextArg() {
		return d.Errf("zone %s: one name, then a block:\n%s", name, zoneExample(name))
	}
	if _, dup := h.Zones[name]; dup {
		return d.Errf("zone %s is defined twice in this directive: give the second one another name", name)
	}
	z := new(Zone)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		switch sub {
		case "match":
			ms, err := caddyhttp.ParseCaddyfileNestedMatcherSet(d)
			if err != nil {
				return d.Errf("zone %s: match: %v", name, err)
			}
			z.MatcherSetsRaw = append(z.MatcherSetsRaw, ms)
			continue
		case "shared":
			if d.NextArg() {
				return d.Errf("zone %s: shared takes no value: write shared alone", name)
			}
			z.Shared = true
			continue
		}
		if !d.NextArg() {
			return d.Errf("zone %s: %s: want a value, e.g. %s", name, sub, example(sub))
		}
		if err := zoneSetting(d, z, name, sub); err != nil {
			return err
		}
		if d.NextArg() {
			return d.Errf("zone %s: %s: one value only, not also %q (quote a key with spaces)", name, sub, d.Val())
		}
	}
	switch {
	case z.Key == "":
		return at.Errf("zone %s: key is missing: set one, e.g. key {remote_host}", name)
	case z.Events == 0:
		return at.Errf("zone %s: events is missing: set how many requests a key may make per window, e.g. events 100", name)
	case z.Window == 0:
		return at.Errf("zone %s: window is missing: set the period of events, e.g. window 1m", name)
	}
	if _, err := parseKey(z.Key); err != nil {
		return at.Errf("zone %s: key %q: %v", name, z.Key, err)
	}
	if _, err := z.rate().Compile(); err != nil {
		return at.Errf("zone %s: %s", name, rateError(err))
	}
	if h.Zones == nil {
		h.Zones = map[string]*Zone{}
	}
	h.Zones[name] = z
	return nil
}

// zoneSetting reads zone name's setting sub, its value the dispenser's.
func zoneSetting(d *caddyfile.Dispenser, z *Zone, name, sub string) error {
	val := d.Val()
	switch sub {
	case "key":
		z.Key = val
	case "events", "burst":
		n, err := strconv.ParseFloat(val, 64)
		if err != nil || !(n > 0) {
			return d.Errf("zone %s: %s %q: want a positive number of requests, e.g. %s", name, sub, val, example(sub))
		}
		if sub == "events" {
			z.Events = n
		} else {
			z.Burst = n
		}
	case "window":
		w, err := caddy.ParseDuration(val)
		if err != nil || w <= 0 {
			return d.Errf("zone %s: window %q: want a positive duration, e.g. window 10s or window 1m", name, val)
		}
		z.Window = caddy.Duration(w)
	default:
		return d.Errf("zone %s: unrecognized subdirective %q: want key, events, window, burst, match or shared", name, sub)
	}
	return nil
}

// example is what to write for a zone's subdirective.
func example(sub string) string {
	switch sub {
	case "key":
		return "key {remote_host}"
	case "events":
		return "events 100"
	case "window":
		return "window 1m"
	case "burst":
		return "burst 20"
	}
	return sub + " <value>"
}

// unmarshalFleet reads a fleet block, the dispenser on its "fleet" token
// (README.md, Fleets). Each setting is SketchProxy's fleet setting of the
// same name; the block is then checked by SketchProxy's own code, and a
// mistake it finds is reported in its words at the line of the setting
// at fault.
func unmarshalFleet(d *caddyfile.Dispenser) (*Fleet, error) {
	at := here(d)
	if d.NextArg() {
		return nil, d.Errf("fleet takes a block, not %q: write fleet { redis <host:port> ... }", d.Val())
	}
	f := new(Fleet)
	lines := map[string]*caddyfile.Dispenser{} // by SketchProxy's field name, less "fleet."
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if _, dup := lines[sub]; dup {
			return nil, d.Errf("fleet: %s is given twice", sub)
		}
		lines[sub] = here(d)
		switch sub {
		case "cluster":
			f.Cluster = d.RemainingArgs()
			if len(f.Cluster) == 0 {
				return nil, d.Errf("fleet: cluster: want seed nodes, e.g. cluster 10.0.0.11:6379 10.0.0.12:6379")
			}
			continue
		case "sentinel":
			if err := unmarshalSentinel(d, f, lines); err != nil {
				return nil, err
			}
			continue
		case "tls":
			if err := unmarshalFleetTLS(d, f, lines); err != nil {
				return nil, err
			}
			continue
		}
		if err := fleetSetting(d, f, sub); err != nil {
			return nil, err
		}
		if d.NextArg() {
			return nil, d.Errf("fleet: %s: one value only, not also %q", sub, d.Val())
		}
	}
	if err := fleetChecked(f, at, lines); err != nil {
		return nil, err
	}
	return f, nil
}

// fleetSetting reads the one value of the fleet setting sub into f.
func fleetSetting(d *caddyfile.Dispenser, f *Fleet, sub string) (err error) {
	switch sub {
	case "redis":
		f.Redis, err = fleetArg(d, sub, "redis 127.0.0.1:6379 or redis rediss://user@redis.internal:6380/0")
	case "username":
		f.Username, err = fleetArg(d, sub, "username sketchproxy")
	case "password":
		f.Password, err = fleetArg(d, sub, "password_file /run/secrets/redis-password (or password_env, or password <password>)")
	case "password_env":
		f.PasswordEnv, err = fleetArg(d, sub, "password_env REDIS_PASSWORD")
	case "password_file":
		f.PasswordFile, err = fleetArg(d, sub, "password_file /run/secrets/redis-password")
	case "secret":
		f.Secret, err = fleetArg(d, sub, "secret_file /etc/caddy/fleet-secret (or secret <at least 16 bytes>)")
	case "secret_file":
		f.SecretFile, err = fleetArg(d, sub, "secret_file /etc/caddy/fleet-secret")
	case "id":
		f.ID, err = fleetArg(d, sub, "id caddy-a")
	case "prefix":
		f.Prefix, err = fleetArg(d, sub, `prefix "sketchproxy:"`)
	case "db":
		f.DB, err = fleetInt(d, sub)
	case "replicas":
		f.Replicas, err = fleetInt(d, sub)
	case "min_replicas":
		f.MinReplicas, err = fleetInt(d, sub)
	case "max_hot":
		f.MaxHot, err = fleetInt(d, sub)
	case "interval":
		f.Interval, err = fleetDuration(d, sub)
	case "timeout":
		f.Timeout, err = fleetDuration(d, sub)
	case "promote_fraction":
		var v string
		if v, err = fleetArg(d, sub, fleetExample(sub)); err == nil {
			if f.PromoteFraction, err = strconv.ParseFloat(v, 64); err != nil {
				return d.Errf("fleet: promote_fraction %q: want a fraction, e.g. %s", v, fleetExample(sub))
			}
		}
	default:
		return d.Errf("fleet: unrecognized setting %q: want redis, cluster, sentinel, username, password, password_env, password_file, db, tls, secret, secret_file, replicas, min_replicas, id, interval, timeout, promote_fraction, max_hot or prefix", sub)
	}
	return err
}

// fleetChecked checks f as SketchProxy checks a fleet section, and
// points an error at the line of the setting it names (lines), or at the
// block (at).
func fleetChecked(f *Fleet, at *caddyfile.Dispenser, lines map[string]*caddyfile.Dispenser) error {
	if err := f.check(); err != nil {
		var ce *spconfig.Error
		if !errors.As(err, &ce) {
			return at.Errf("%v", err)
		}
		// "fleet.cluster[1]" is the cluster line; "fleet" the block's.
		field, _, _ := strings.Cut(strings.TrimPrefix(ce.Field, "fleet."), "[")
		line := lines[field]
		if line == nil {
			line = at
		}
		return line.Errf("%v", ce)
	}
	return nil
}

// fleetArg reads a fleet setting's one value, or says what to write.
func fleetArg(d *caddyfile.Dispenser, sub, example string) (string, error) {
	if !d.NextArg() {
		return "", d.Errf("fleet: %s: want a value, e.g. %s", sub, example)
	}
	return d.Val(), nil
}

// fleetInt reads a fleet setting's whole number (its range is checked
// with the block).
func fleetInt(d *caddyfile.Dispenser, sub string) (int, error) {
	v, err := fleetArg(d, sub, fleetExample(sub))
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("fleet: %s %q: want a whole number, e.g. %s", sub, v, fleetExample(sub))
	}
	return n, nil
}

// fleetDuration reads a fleet setting's duration (its range is checked
// with the block).
func fleetDuration(d *caddyfile.Dispenser, sub string) (caddy.Duration, error) {
	v, err := fleetArg(d, sub, fleetExample(sub))
	if err != nil {
		return 0, err
	}
	t, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("fleet: %s %q: want a duration, e.g. %s", sub, v, fleetExample(sub))
	}
	return caddy.Duration(t), nil
}

// fleetExample is what to write for a fleet's numeric setting.
func fleetExample(sub string) string {
	return map[string]string{
		"db": "db 2", "replicas": "replicas 3 (or 0: count the replicas that heartbeat)", "min_replicas": "min_replicas 3", "max_hot": "max_hot 10000",
		"interval": "interval 500ms", "timeout": "timeout 250ms", "promote_fraction": "promote_fraction 0.5",
	}[sub]
}

// unmarshalSentinel reads "sentinel <master> <addrs...> [{ password ... }]".
func unmarshalSentinel(d *caddyfile.Dispenser, f *Fleet, lines map[string]*caddyfile.Dispenser) error {
	args := d.RemainingArgs()
	if len(args) < 2 {
		return d.Errf("fleet: sentinel: want the master's name and the sentinels, e.g. sentinel mymaster 10.0.0.21:26379 10.0.0.22:26379")
	}
	f.Sentinel = &FleetSentinel{Master: args[0], Addrs: args[1:]}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		lines["sentinel."+sub] = here(d)
		v, err := fleetArg(d, "sentinel "+sub, "password_env SENTINEL_PASSWORD")
		if err != nil {
			return err
		}
		switch sub {
		case "password":
			f.Sentinel.Password = v
		case "password_env":
			f.Sentinel.PasswordEnv = v
		default:
			return d.Errf("fleet: sentinel: unrecognized setting %q: want password or password_env (the sentinels' own)", sub)
		}
		if d.NextArg() {
			return d.Errf("fleet: sentinel %s: one value only, not also %q", sub, d.Val())
		}
	}
	return nil
}

// unmarshalFleetTLS reads "tls" (TLS with the system's CAs) or a tls block.
func unmarshalFleetTLS(d *caddyfile.Dispenser, f *Fleet, lines map[string]*caddyfile.Dispenser) error {
	if d.NextArg() {
		return d.Errf("fleet: tls takes a block or nothing, not %q: write tls { ca_file <path> }", d.Val())
	}
	f.TLS = new(FleetTLS)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		lines["tls."+sub] = here(d)
		v, err := fleetArg(d, "tls "+sub, sub+" <path>")
		if err != nil {
			return err
		}
		switch sub {
		case "ca_file":
			f.TLS.CAFile = v
		case "cert_file":
			f.TLS.CertFile = v
		case "key_file":
			f.TLS.KeyFile = v
		case "server_name":
			f.TLS.ServerName = v
		default:
			return d.Errf("fleet: tls: unrecognized setting %q: want ca_file, cert_file, key_file or server_name", sub)
		}
		if d.NextArg() {
			return d.Errf("fleet: tls %s: one value only, not also %q", sub, d.Val())
		}
	}
	return nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
