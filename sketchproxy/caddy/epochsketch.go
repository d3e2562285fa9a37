// Package caddyepochsketch is the Caddy HTTP handler http.handlers.epochsketch:
// SketchProxy's rate limiter (sketchproxy.Middleware, the decision engine
// of the proxy, its forward-auth check and its Envoy service) inside Caddy,
// with no other process and no other hop.
//
// Each zone is a key (a Caddy placeholder, resolved per request), a number
// of events per window and an optional burst. A request over a zone's limit
// gets 429 with Retry-After and the draft RateLimit and RateLimit-Policy
// fields; an admitted one goes on to the next handler with the RateLimit
// fields on its response. The counts live in fixed-memory sketches that
// survive a config reload with the same zones (see pool). The Caddyfile
// form is in caddyfile.go, the metrics in metrics.go.
package caddyepochsketch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the epochsketch handler's configuration (its JSON form) and,
// once provisioned, the Middleware it decides with. Provision it through
// Caddy; it is then safe for concurrent use.
type Handler struct {
	// Zones are the limits, by name: every zone must admit a request.
	// A name is letters, digits, '-' and '_'.
	Zones map[string]*Zone `json:"zones,omitempty"`
	// SketchBuckets sizes each sketch, 64 bytes a bucket (default 65536:
	// 4 MiB, about 130k keys above the noise). Memory never grows with the
	// number of keys.
	SketchBuckets int `json:"sketch_buckets,omitempty"`
	// NewKeysOff turns off the key-rotation defense (on by default: while
	// keys never seen before spike, keys first seen during the spike get a
	// quarter of each limit; see sketchproxy's README, "New keys").
	NewKeysOff bool `json:"new_keys_off,omitempty"`

	mw      *sketchproxy.Middleware
	poolKey string
	headers []string // the zones' internal key headers, by zone (sorted by name)
	keys    []string // the zones' key placeholders, in the same order
	prefix  bool     // a key uses {http.epochsketch.client_prefix}
}

// prefixPlaceholder is the client's address as SketchProxy's ip key groups
// it: Caddy's {client_ip} (the connection's address, or past Caddy's
// trusted_proxies the one they name), an IPv6 address cut to its /64, the
// one subscriber's whole network, so that rotating through it gains no
// requests. {remote_host} is the exact address.
const prefixPlaceholder = "http.epochsketch.client_prefix"

// clientPrefix is prefixPlaceholder's value for r: "-" if Caddy has no
// client address.
func clientPrefix(r *http.Request) string {
	s, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "-"
	}
	if a = a.Unmap(); a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().String()
	}
	return a.String()
}

// Zone is one limit: Events requests per Window for each value of Key.
type Zone struct {
	// Key is the placeholder a request's key is read from, e.g.
	// {remote_host}, {http.epochsketch.client_prefix} (IPv6 by /64) or
	// {http.request.header.X-API-Key}. A placeholder that
	// resolves to nothing (a missing header) is the key "-": all such
	// requests share one count.
	Key string `json:"key"`
	// Events is how many requests a key may make per Window.
	Events float64 `json:"events"`
	// Window is the period of Events.
	Window caddy.Duration `json:"window"`
	// Burst is the most requests a quiet key may send at once (default
	// Events).
	Burst float64 `json:"burst,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.epochsketch",
		New: func() caddy.Module { return new(Handler) },
	}
}

// keyHeaderPrefix starts the request headers that carry each zone's
// resolved key to the Middleware (rules keyed header:Epochsketch-Zone-N).
// A client's own copies, in any spelling a server might read as one, are
// removed first, so no client chooses its key; ours are removed before the
// next handler.
const keyHeaderPrefix = "Epochsketch-Zone-"

// names returns the zones' names, sorted: the rules' and headers' order.
func (h *Handler) names() []string {
	names := make([]string, 0, len(h.Zones))
	for n := range h.Zones {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// validate checks what the engine would not see: the zones' presence and
// their keys. The engine checks names and numbers, with its own messages.
func (h *Handler) validate() error {
	if len(h.Zones) == 0 {
		return fmt.Errorf("epochsketch: no zones: add at least one zone with a key, events and a window")
	}
	for _, name := range h.names() {
		z := h.Zones[name]
		if z == nil {
			return fmt.Errorf("epochsketch: zone %q is empty: give it a key, events and a window", name)
		}
		if strings.TrimSpace(z.Key) == "" {
			return fmt.Errorf("epochsketch: zone %q has no key: set one, e.g. key {remote_host}", name)
		}
		if z.Events <= 0 {
			return fmt.Errorf("epochsketch: zone %q: events %v: want a positive number of requests per window", name, z.Events)
		}
		if z.Window <= 0 {
			return fmt.Errorf("epochsketch: zone %q: window %v: want a positive duration, e.g. 10s", name, time.Duration(z.Window))
		}
		if z.Burst < 0 {
			return fmt.Errorf("epochsketch: zone %q: burst %v: want a positive number (or none: events)", name, z.Burst)
		}
	}
	if h.SketchBuckets < 0 {
		return fmt.Errorf("epochsketch: sketch_buckets %d: want a positive power of two, or none (65536)", h.SketchBuckets)
	}
	return nil
}

// config is the engine's configuration for the zones: one rule per zone,
// keyed by its internal header, refused requests not counted (a client over
// the limit still gets the limit, as with Caddy's other rate limiters), no
// tarpit. What Caddy owns is left to Caddy: the client address (no
// trusted proxies: every key comes from a placeholder), request bodies
// (streamed, not buffered; the engine's body timeout at its 1h maximum,
// Caddy's own timeouts govern) and in-flight caps (none).
func (h *Handler) config() *sketchproxy.Config {
	cfg := &sketchproxy.Config{
		Server: sketchproxy.ServerConfig{
			BufferBody:           new(int),
			MaxInFlightPerClient: new(int),
			BodyTimeout:          sketchproxy.Duration(time.Hour),
		},
		Sketch:  sketchproxy.SketchConfig{Buckets: h.SketchBuckets},
		NewKeys: sketchproxy.NewKeysConfig{Disabled: h.NewKeysOff},
	}
	for i, name := range h.names() {
		z := h.Zones[name]
		cfg.Rules = append(cfg.Rules, sketchproxy.Rule{
			Name: name,
			Key:  []string{"header:" + keyHeaderPrefix + strconv.Itoa(i)},
			Limits: []sketchproxy.Limit{{
				Requests: z.Events, Per: sketchproxy.Duration(z.Window), Burst: z.Burst,
			}},
		})
	}
	return cfg
}

// zoneError says an engine's error about a rule in the Caddyfile's words:
// rules[1].limits[0].requests is zone NAME: events.
func (h *Handler) zoneError(err error) error {
	var ce *sketchproxy.ConfigError
	if !errors.As(err, &ce) {
		return fmt.Errorf("epochsketch: %w", err)
	}
	field, names := ce.Field, h.names()
	var i int
	if _, e := fmt.Sscanf(field, "rules[%d]", &i); e == nil && i >= 0 && i < len(names) {
		rest := strings.TrimPrefix(field[strings.Index(field, "]")+1:], ".limits[0]")
		switch rest = strings.TrimPrefix(rest, "."); rest {
		case "requests":
			rest = "events"
		case "per":
			rest = "window"
		}
		field = fmt.Sprintf("zone %q", names[i])
		if rest != "" {
			field += ": " + rest
		}
	}
	return fmt.Errorf("epochsketch: %s: %s", field, ce.Msg)
}

// Provision builds the zones' Middleware, or takes the one a previous
// config with the same zones left in the pool, counts and all.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.validate(); err != nil {
		return err
	}
	cfg := h.config()
	if err := cfg.Validate(); err != nil {
		return h.zoneError(err)
	}
	sum, err := json.Marshal(struct {
		Zones   map[string]*Zone
		Buckets int
		NewOff  bool
	}{h.Zones, h.SketchBuckets, h.NewKeysOff})
	if err != nil {
		return fmt.Errorf("epochsketch: %w", err)
	}
	d := sha256.Sum256(sum)
	h.poolKey = hex.EncodeToString(d[:])
	v, _, err := pool.LoadOrNew(h.poolKey, func() (caddy.Destructor, error) {
		log := new(logSwitch)
		log.cur.Store(ctx.Slogger())
		mw, err := sketchproxy.New(cfg, http.HandlerFunc(callNext), sketchproxy.Options{Logger: slog.New(log)})
		if err != nil {
			return nil, h.zoneError(err)
		}
		return pooled{mw, log}, nil
	})
	if err != nil {
		h.poolKey = ""
		return err
	}
	p := v.(pooled)
	p.log.cur.Store(ctx.Slogger()) // the newest config's logging
	h.mw = p.Middleware
	for i, name := range h.names() {
		h.headers = append(h.headers, keyHeaderPrefix+strconv.Itoa(i))
		h.keys = append(h.keys, h.Zones[name].Key)
		h.prefix = h.prefix || strings.Contains(h.Zones[name].Key, "{"+prefixPlaceholder+"}")
	}
	if err := registerMetrics(ctx.GetMetricsRegistry()); err != nil {
		_ = h.Cleanup()
		return err
	}
	return nil
}

// Validate checks the configuration (Provision has built it already; this
// repeats the checks for tools that only validate).
func (h *Handler) Validate() error { return h.validate() }

// Cleanup releases this config's hold on the Middleware: the last config
// using these zones closes it.
func (h *Handler) Cleanup() error {
	if h.poolKey == "" {
		return nil
	}
	_, err := pool.Delete(h.poolKey)
	h.poolKey = ""
	return err
}

// nextKey is the context key of a request's *nextCall.
type nextKey struct{}

// nextCall carries Caddy's next handler through the Middleware, which was
// built once with callNext as its next, and brings its error back.
type nextCall struct {
	next    caddyhttp.Handler
	headers []string
	called  bool // the Middleware admitted the request
	err     error
}

// callNext is the Middleware's next handler: the request's Caddy next,
// without the internal key headers.
func callNext(w http.ResponseWriter, r *http.Request) {
	c := r.Context().Value(nextKey{}).(*nextCall)
	c.called = true
	for _, name := range c.headers {
		r.Header.Del(name)
	}
	c.err = c.next.ServeHTTP(w, r)
}

// ServeHTTP resolves each zone's key, lets the Middleware decide, and
// returns the next handler's error if the request went on.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	repl := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.prefix {
		repl.Set(prefixPlaceholder, clientPrefix(r))
	}
	stripKeyHeaders(r.Header)
	for i, k := range h.keys {
		r.Header.Set(h.headers[i], repl.ReplaceAll(k, ""))
	}
	c := &nextCall{next: next, headers: h.headers}
	hd := w.Header()
	if prior := hd[policyKey]; prior != nil {
		// An epochsketch handler before this one (another matcher's
		// zones) admitted the request: its fields and ours go together.
		mw := &mergeWriter{ResponseWriterWrapper: &caddyhttp.ResponseWriterWrapper{ResponseWriter: w}, c: c, policy: prior, rateLimit: hd[rateLimitKey]}
		delete(hd, policyKey)
		delete(hd, rateLimitKey)
		w = mw
	}
	h.mw.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nextKey{}, c)))
	return c.err
}

// The draft RateLimit fields' keys in a header map.
var (
	policyKey    = http.CanonicalHeaderKey("RateLimit-Policy")
	rateLimitKey = http.CanonicalHeaderKey("RateLimit")
)

// mergeWriter joins an earlier epochsketch handler's RateLimit fields to
// this one's when the response starts: RateLimit-Policy lists every
// policy; RateLimit lists all of them on an admitted request, and on a
// refusal only this handler's, the policies the client is over.
type mergeWriter struct {
	*caddyhttp.ResponseWriterWrapper
	c                 *nextCall
	policy, rateLimit []string
	done              bool
}

func (mw *mergeWriter) merge() {
	if mw.done {
		return
	}
	mw.done = true
	hd := mw.Header()
	join := func(key string, prior []string) {
		if ours := hd[key]; len(ours) > 0 {
			hd[key] = []string{strings.Join(append(slices.Clone(prior), ours...), ", ")}
		} else {
			hd[key] = prior
		}
	}
	join(policyKey, mw.policy)
	if mw.c.called {
		join(rateLimitKey, mw.rateLimit)
	}
}

func (mw *mergeWriter) WriteHeader(code int) {
	if code >= 200 {
		mw.merge()
	}
	mw.ResponseWriterWrapper.WriteHeader(code)
}

func (mw *mergeWriter) Write(p []byte) (int, error) {
	mw.merge()
	return mw.ResponseWriterWrapper.Write(p)
}

func (mw *mergeWriter) ReadFrom(r io.Reader) (int64, error) {
	mw.merge()
	return mw.ResponseWriterWrapper.ReadFrom(r)
}

// stripKeyHeaders deletes a client's headers that read as an internal key
// header: Epochsketch-Zone-N itself, or spelled with '_' for '-' (CGI and
// WSGI upstreams read them as one; the engine refuses such a request as
// ambiguous).
func stripKeyHeaders(hd http.Header) {
	for name := range hd {
		if len(name) >= len(keyHeaderPrefix) && strings.EqualFold(strings.ReplaceAll(name[:len(keyHeaderPrefix)], "_", "-"), keyHeaderPrefix) {
			delete(hd, name)
		}
	}
}

// pool holds the Middlewares by a hash of their zones' configuration, so a
// reload that keeps the zones keeps their counts: the new config takes the
// Middleware before the old one lets go of it.
var pool = caddy.NewUsagePool()

// pooled is a Middleware in the pool, and its logger; the pool closes it
// when the last config using it is cleaned up.
type pooled struct {
	*sketchproxy.Middleware
	log *logSwitch
}

// logSwitch sends a pooled Middleware's log to the logger of the newest
// config that provisioned it: a reload may change Caddy's logging, and
// closes the old config's writers.
type logSwitch struct{ cur atomic.Pointer[slog.Logger] }

func (l *logSwitch) Enabled(ctx context.Context, lv slog.Level) bool {
	return l.cur.Load().Handler().Enabled(ctx, lv)
}

func (l *logSwitch) Handle(ctx context.Context, r slog.Record) error {
	return l.cur.Load().Handler().Handle(ctx, r)
}

// WithAttrs and WithGroup bind to the logger of now (the Middleware uses
// neither).
func (l *logSwitch) WithAttrs(as []slog.Attr) slog.Handler {
	return l.cur.Load().Handler().WithAttrs(as)
}

func (l *logSwitch) WithGroup(name string) slog.Handler {
	return l.cur.Load().Handler().WithGroup(name)
}

func (p pooled) Destruct() error { return p.Close() }

// Interface guards.
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddy.Destructor            = pooled{}
)
