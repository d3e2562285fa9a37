package caddyepochsketch

import (
	"strconv"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
	// options moves it.
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
			return d.Errf("unrecognized subdirective %q: want zone, sketch_buckets, new_keys, jitter or log_key", sub)
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

var _ caddyfile.Unmarshaler = (*Handler)(nil)
