// Package caddyepochsketch is the Caddy HTTP handler http.handlers.epochsketch:
// SketchProxy's rate limiter inside Caddy, with no other process and no
// other hop, and the request matcher http.matchers.epochsketch_path.
//
// The handler decides each request with SketchProxy's decision engine
// (sketchproxy/internal/engine), the one call every door of SketchProxy
// makes: the zones a request matches, with its key under each, go in; a
// decision comes out. An admitted request goes on to the next handler with
// the draft RateLimit and RateLimit-Policy fields on its response; a refused
// one never reaches it: the handler returns the 429 as an error with
// Retry-After and the fields already set, where error routes
// (handle_errors) would answer it, and else answers it itself
// (refuse.go). The handler changes nothing of the request the next handler sees.
//
// Each zone counts in fixed-memory sketches of its own that outlive a
// config reload which keeps the zone (zones.go); with a fleet, N Caddys
// share those counts through Redis (fleet.go). README.md in this
// directory is the directive's documentation; caddyfile.go reads the
// Caddyfile, keys.go resolves keys, refuse.go answers refusals, matcher.go
// is the path matcher and metrics.go the metrics.
package caddyepochsketch

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the epochsketch handler's configuration (its JSON form) and,
// once provisioned, its zones. Provision it through Caddy; it is then safe
// for concurrent use.
type Handler struct {
	// Zones are the limits, by name: every zone whose matchers match a
	// request must admit it. A name is letters, digits, '-' and '_'.
	Zones map[string]*Zone `json:"zones,omitempty"`
	// SketchBuckets sizes each zone's sketch, 64 bytes a bucket, 1 to
	// 67108864 (default 65536: 4 MiB, room for 131,072 heavy hitters by
	// epochsketch.BucketsFor's rule). Memory never grows with the number
	// of keys.
	SketchBuckets int `json:"sketch_buckets,omitempty"`
	// NewKeysOff turns off the key-rotation defense (on by default: while
	// keys never seen before spike, keys first seen during the spike get a
	// quarter of each limit; see sketchproxy/docs/rules-and-limits.md, "New keys").
	NewKeysOff bool `json:"new_keys_off,omitempty"`
	// Jitter lengthens each refusal's Retry-After by a random fraction of
	// it, up to Jitter (0 to 1; default 0), so that clients refused
	// together do not all come back in the same second. The RateLimit
	// field's values stay exact.
	Jitter float64 `json:"jitter,omitempty"`
	// LogKey logs a refused request's key as it is; by default the log
	// shows a keyed hash of it ("k:" and 12 hex digits, the same for the
	// same key while Caddy runs), since keys are addresses and API keys.
	LogKey bool `json:"log_key,omitempty"`
	// Fleet shares the zones' counts with other Caddys through Redis,
	// SketchProxy's fleet: N replicas enforce one limit (fleet.go).
	// Handlers with equal settings share one fleet. Default: none, this
	// Caddy counts alone.
	Fleet *Fleet `json:"fleet,omitempty"`

	zones    []*zoneRef // by name
	side     *sideRef   // the side sketches every zone of the handler reads
	eng      *engine.Engine
	fleet    *fleetState // held while the handler lives; nil without Fleet
	prefix   bool        // a key uses {http.epochsketch.client_prefix}
	loc      location    // where the handler sits (zones.go)
	asErrors errorMode
	logger   *zap.Logger

	// Tests set these before Provision: the clock and seed of the
	// engine, and the jitter's random numbers.
	clock epochsketch.Clock
	seed  uint64
	rand  func() float64
}

// Zone is one limit: Events requests per Window for each value of Key.
type Zone struct {
	// Key is the key a request counts under: placeholders resolved per
	// request, e.g. {remote_host}, {http.epochsketch.client_prefix} (IPv6
	// by /64) or {http.request.header.X-API-Key}. A header sent more than
	// once counts under its first value; a query parameter or cookie
	// given more than once is refused with 400 (keys.go says why). A key
	// that resolves to nothing (a missing header) is "-": all such
	// requests share one count.
	Key string `json:"key"`
	// Events is how many requests a key may make per Window.
	Events float64 `json:"events"`
	// Window is the period of Events.
	Window caddy.Duration `json:"window"`
	// Burst is the most requests a quiet key may send at once (default
	// Events).
	Burst float64 `json:"burst,omitempty"`
	// Shared makes the zone one count wherever a zone of the same name
	// and definition is configured (other sites, other routes); by
	// default a zone counts apart from identical zones elsewhere.
	Shared bool `json:"shared,omitempty"`
	// MatcherSetsRaw selects the requests the zone judges (default: every
	// request the handler sees). A request matches as each method it is
	// judged as, too: a HEAD as GET, any case in capitals, and a POST as
	// the method its X-HTTP-Method-Override, X-HTTP-Method or
	// X-Method-Override header or _method query parameter names.
	MatcherSetsRaw caddyhttp.RawMatcherSets `json:"match,omitempty" caddy:"namespace=http.matchers"`

	matchers caddyhttp.MatcherSets
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.epochsketch",
		New: func() caddy.Module { return new(Handler) },
	}
}

// prefixPlaceholder is the client's address as SketchProxy's ip key groups
// it (keys.go, clientPrefix).
const prefixPlaceholder = "http.epochsketch.client_prefix"

// names returns the zones' names, sorted: the order zones are decided in.
func (h *Handler) names() []string {
	names := make([]string, 0, len(h.Zones))
	for n := range h.Zones {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

var reName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validate checks the configuration, saying for each mistake the zone and
// subdirective at fault and what to write instead.
func (h *Handler) validate() error {
	if len(h.Zones) == 0 {
		// A Caddyfile's directive has said so already (UnmarshalCaddyfile):
		// this is JSON's error, in JSON.
		return errors.New(`epochsketch: no zones: add at least one with a key, events and a window, e.g. "zones": {"per_ip": {"key": "{http.epochsketch.client_prefix}", "events": 5, "window": "10s"}}`)
	}
	for _, name := range h.names() {
		z := h.Zones[name]
		if !reName.MatchString(name) {
			return fmt.Errorf("epochsketch: zone %q: name: use 1 to 64 letters, digits, - and _, e.g. per_ip", name)
		}
		if z == nil {
			return fmt.Errorf("epochsketch: zone %q is empty: give it a key, events and a window", name)
		}
		if strings.TrimSpace(z.Key) == "" {
			return fmt.Errorf(`epochsketch: zone %q: key is missing: set one, e.g. "key": "{http.epochsketch.client_prefix}"`, name)
		}
		if _, err := parseKey(z.Key); err != nil {
			return fmt.Errorf("epochsketch: zone %q: key %q: %v", name, z.Key, err)
		}
		if z.Events == 0 {
			return fmt.Errorf("epochsketch: zone %q: events is missing: set how many requests a key may make per window, e.g. events 100", name)
		}
		if z.Window == 0 {
			return fmt.Errorf("epochsketch: zone %q: window is missing: set the period of events, e.g. window 1m", name)
		}
		if !(z.Events > 0) || math.IsInf(z.Events, 0) {
			return fmt.Errorf("epochsketch: zone %q: events %v: want a positive number of requests per window, e.g. events 100", name, z.Events)
		}
		if z.Window <= 0 {
			return fmt.Errorf("epochsketch: zone %q: window %v: want a positive duration, e.g. window 10s", name, time.Duration(z.Window))
		}
		if z.Burst < 0 {
			return fmt.Errorf("epochsketch: zone %q: burst %v: want a positive number of requests (or none: events)", name, z.Burst)
		}
		if _, err := z.rate().Compile(); err != nil {
			return fmt.Errorf("epochsketch: zone %q: %s", name, rateError(err))
		}
	}
	if h.SketchBuckets < 0 || h.SketchBuckets > maxBuckets {
		return fmt.Errorf("epochsketch: sketch_buckets %d: want %s, or none (65536)", h.SketchBuckets, bucketsWant)
	}
	if !(h.Jitter >= 0 && h.Jitter <= 1) {
		return fmt.Errorf("epochsketch: jitter %v: want a fraction from 0 to 1, e.g. jitter 0.2 (up to 20%% more)", h.Jitter)
	}
	if h.Fleet != nil {
		if err := h.Fleet.check(); err != nil {
			return fmt.Errorf("epochsketch: %w", err)
		}
	}
	for _, name := range h.names() {
		for _, p := range placeholders(h.Zones[name].Key) {
			if why := knownPlaceholder(p); why != "" {
				return fmt.Errorf("epochsketch: zone %q: key %q: %s", name, h.Zones[name].Key, why)
			}
		}
	}
	return nil
}

// rate is the zone's limit as package rate compiles it.
func (z *Zone) rate() rate.Rate {
	return rate.Rate{Requests: z.Events, Per: time.Duration(z.Window), Burst: z.Burst}
}

// rateFields are package rate's field names in the Caddyfile's words.
var rateFields = strings.NewReplacer("Requests", "events", "Per", "window", "Burst", "burst")

// rateError says a limit package rate refuses in the Caddyfile's words:
// "burst: 0.4 rounds to 0: want 1 to ...".
func rateError(err error) string {
	if re, ok := err.(*rate.Error); ok {
		return rateFields.Replace(re.Field) + ": " + rateFields.Replace(re.Msg)
	}
	return err.Error()
}

// buckets is the sketches' size, the default applied.
func (h *Handler) buckets() int {
	if h.SketchBuckets == 0 {
		return 1 << 16
	}
	return h.SketchBuckets
}

// Provision takes each zone's counts from the pool, or starts them, and
// loads the zones' matchers.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.validate(); err != nil {
		return err
	}
	if err := h.laterAuth(ctx); err != nil {
		return err
	}
	h.logger = ctx.Logger(h)
	if h.rand == nil {
		h.rand = rand.Float64
	}
	for _, name := range h.names() {
		z := h.Zones[name]
		if z.MatcherSetsRaw != nil {
			v, err := ctx.LoadModule(z, "MatcherSetsRaw")
			if err != nil {
				return fmt.Errorf("epochsketch: zone %q: match: %v", name, err)
			}
			if err := z.matchers.FromInterface(v); err != nil {
				return fmt.Errorf("epochsketch: zone %q: match: %v", name, err)
			}
		}
		h.prefix = h.prefix || strings.Contains(z.Key, "{"+prefixPlaceholder+"}")
	}
	h.loc = locate(ctx)
	h.asErrors = errorModeOf(h.loc)
	if err := h.takeZones(ctx); err != nil {
		h.Cleanup()
		return err
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		h.Cleanup()
		return err
	}
	return nil
}

// Validate checks the configuration (Provision has checked it already;
// this repeats the checks for tools that only validate).
func (h *Handler) Validate() error { return h.validate() }

// Cleanup lets go of this config's zones and fleet: the last config that
// uses a zone frees its sketches, and the last that uses a fleet stops it.
func (h *Handler) Cleanup() error {
	for _, z := range h.zones {
		z.release()
	}
	h.zones = nil
	if h.side != nil {
		h.side.release()
		h.side = nil
	}
	if h.fleet != nil {
		h.fleet.release()
		h.fleet = nil
	}
	return nil
}

// scratches are the engine's per-request working memory, reused.
var scratches = sync.Pool{New: func() any { return new(engine.Scratch) }}

// fieldsVar marks a request whose response carries an epochsketch
// handler's RateLimit fields already: a later handler adds its own to them.
const fieldsVar = "epochsketch.fields"

// ServeHTTP decides the request in every zone that matches it, at once,
// and hands an admitted request to next, unchanged.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.prefix {
		repl.Set(prefixPlaceholder, clientPrefix(r))
	}
	var room [8]engine.Fact
	facts := room[:0]
	var mv methodVariants
	for _, z := range h.zones {
		if z.zone.matchers != nil {
			ok, err := mv.match(z.zone.matchers, r)
			if err != nil {
				return caddyhttp.Error(http.StatusInternalServerError, fmt.Errorf("epochsketch: zone %q: match: %w", z.name, err))
			}
			if !ok {
				continue
			}
		}
		key, why := z.key.resolve(r, repl)
		if why != "" {
			return h.badKey(w, r, z, why)
		}
		facts = append(facts, engine.Fact{Rule: z.state.rule, Key: key})
	}
	if len(facts) == 0 {
		return next.ServeHTTP(w, r)
	}
	sc := scratches.Get().(*engine.Scratch)
	defer func() {
		sc.Reset()
		scratches.Put(sc)
	}()
	d := h.eng.Decide(r.Context(), h.side.set, h.eng.Now(), &engine.Request{Facts: facts, NoDrip: true}, sc)
	defer d.Done()
	if !d.Admitted {
		return h.refuse(w, r, repl, &d)
	}
	h.setFields(w.Header(), r, &d.Fields, false)
	return next.ServeHTTP(w, r)
}

// The draft RateLimit fields' keys in a header map.
var (
	policyKey    = http.CanonicalHeaderKey("RateLimit-Policy")
	rateLimitKey = http.CanonicalHeaderKey("RateLimit")
)

// setFields sets the RateLimit-Policy and RateLimit fields of a decision.
// After an earlier epochsketch handler of the same request (another
// directive's zones), RateLimit-Policy lists every policy; RateLimit lists
// all of them on an admitted request, and on a refusal only this handler's
// policies the client is over.
func (h *Handler) setFields(hd http.Header, r *http.Request, f *engine.Fields, refused bool) {
	if !f.Any {
		return
	}
	prior, _ := caddyhttp.GetVar(r.Context(), fieldsVar).(bool)
	caddyhttp.SetVar(r.Context(), fieldsVar, true)
	join := func(key, ours string) {
		if old := hd.Get(key); prior && old != "" {
			ours = old + ", " + ours
		}
		hd[key] = []string{ours}
	}
	join(policyKey, f.Policy)
	switch {
	case len(f.RateLimit) == 0:
	case refused:
		hd[rateLimitKey] = []string{string(f.RateLimit)}
	default:
		join(rateLimitKey, string(f.RateLimit))
	}
}

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)

// methodVariants are a request as each other method SketchProxy judges it
// as (httpnorm.MethodsOf): a HEAD as GET, "delete" as DELETE, a POST as
// the method an override header or _method names, which frameworks route
// it as. Caddy's method matcher compares names exactly, so `method GET`
// missed HEAD and `method DELETE` missed "delete" and overrides. Built once
// per request, when a zone's matchers first miss the request itself; the
// request the handlers see is never changed.
type methodVariants struct {
	done bool
	rs   []*http.Request
}

// everyMethod stands for "every method" when a POST names more than
// httpnorm.Methods lists: a zone that matches any of these matches it.
var everyMethod = [...]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// match reports whether ms matches r, or r as any other method it is
// judged as.
func (mv *methodVariants) match(ms caddyhttp.MatcherSets, r *http.Request) (bool, error) {
	if ok, err := ms.AnyMatchWithError(r); ok || err != nil {
		return ok, err
	}
	if !mv.done {
		mv.done = true
		methods := httpnorm.MethodsOf(r)
		list := methods.List()
		if methods.All {
			list = append(list[:len(list):len(list)], everyMethod[:]...)
		}
		for _, m := range list {
			if m != r.Method {
				r2 := *r
				r2.Method = m
				mv.rs = append(mv.rs, &r2)
			}
		}
	}
	for _, r2 := range mv.rs {
		if ok, err := ms.AnyMatchWithError(r2); ok || err != nil {
			return ok, err
		}
	}
	return false, nil
}
