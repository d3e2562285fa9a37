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
	// Before reverse_proxy, and before the other handlers that answer, so
	// a refused request reaches none of them.
	httpcaddyfile.RegisterDirectiveOrder("epochsketch", httpcaddyfile.Before, "reverse_proxy")
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var hd Handler
	err := hd.UnmarshalCaddyfile(h.Dispenser)
	return &hd, err
}

// UnmarshalCaddyfile reads the directive:
//
//	epochsketch [<matcher>] {
//		zone <name> {
//			key    <placeholder>
//			events <n>
//			window <duration>
//			burst  <n>
//		}
//		sketch_buckets <n>
//		new_keys off
//	}
//
// Requests are selected with the directive's matcher, as for any handler
// (epochsketch @api { ... }); several zones all apply to what it matches.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive's name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		switch d.Val() {
		case "zone":
			if err := h.unmarshalZone(d); err != nil {
				return err
			}
		case "sketch_buckets":
			if !d.NextArg() {
				return d.ArgErr()
			}
			n, err := strconv.Atoi(d.Val())
			if err != nil || n <= 0 {
				return d.Errf("sketch_buckets %q: want a positive power of two, e.g. 65536 (4 MiB)", d.Val())
			}
			h.SketchBuckets = n
			if d.NextArg() {
				return d.ArgErr()
			}
		case "new_keys":
			if !d.NextArg() || d.Val() != "off" {
				return d.Errf("new_keys: the one setting is 'new_keys off'")
			}
			h.NewKeysOff = true
			if d.NextArg() {
				return d.ArgErr()
			}
		default:
			return d.Errf("unrecognized subdirective %q: want zone, sketch_buckets or new_keys", d.Val())
		}
	}
	return nil
}

// unmarshalZone reads one zone block, the dispenser on its "zone" token.
func (h *Handler) unmarshalZone(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("zone: want a name, e.g. zone per_ip { ... }")
	}
	name := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if _, dup := h.Zones[name]; dup {
		return d.Errf("zone %q is defined twice", name)
	}
	z := new(Zone)
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		sub := d.Val()
		if !d.NextArg() {
			return d.Errf("zone %s: %s: want a value", name, sub)
		}
		val := d.Val()
		switch sub {
		case "key":
			z.Key = val
		case "events", "burst":
			n, err := strconv.ParseFloat(val, 64)
			if err != nil || n <= 0 {
				return d.Errf("zone %s: %s %q: want a positive number of requests", name, sub, val)
			}
			if sub == "events" {
				z.Events = n
			} else {
				z.Burst = n
			}
		case "window":
			w, err := caddy.ParseDuration(val)
			if err != nil || w <= 0 {
				return d.Errf("zone %s: window %q: want a positive duration, e.g. 10s or 1m", name, val)
			}
			z.Window = caddy.Duration(w)
		default:
			return d.Errf("zone %s: unrecognized subdirective %q: want key, events, window or burst", name, sub)
		}
		if d.NextArg() {
			return d.ArgErr()
		}
	}
	if h.Zones == nil {
		h.Zones = map[string]*Zone{}
	}
	h.Zones[name] = z
	return nil
}

var _ caddyfile.Unmarshaler = (*Handler)(nil)
