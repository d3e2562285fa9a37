package limit

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Middleware limits each key to l's rate: key(r) names the client of
// request r (RemoteIP is the connection's address; ClientIP the client's
// behind trusted proxies), and a refused request gets 429 Too Many
// Requests with Retry-After, without reaching next. Options add limits
// checked together with l (Also), exempt requests (Skip), replace the
// refusal (OnRefused) and add the legacy X-RateLimit fields
// (LegacyHeaders). Middleware panics if l or key is nil.
//
// Every answer carries the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, as SketchProxy writes them:
//
//	RateLimit-Policy: "default";q=10;w=1
//	RateLimit: "default";r=7;t=1
//
// q requests per w seconds is the limit in whole numbers (2.5 per minute
// is q=5;w=120), r the requests the key may still send (at most q), and t
// the seconds until more quota: until one more request than r fits when
// admitted; the same wait as Retry-After, with r=0, when refused. Config.Name names the policy.
//
// # Several limits
//
// Limits checked together (Also, or a Middleware wrapping another's
// handler directly, as Middleware(a, ka)(Middleware(b, kb)(h)) and
// routers' middleware chains do) admit a request only if every one of them
// does, and count it in each only then: first every limit is read, and if
// one refuses, none counts; else each counts in turn. The fields list one
// item per limit, in order (outer first), in one RateLimit-Policy and one
// RateLimit field, and Retry-After is the longest wait of the limits that
// refused. A limit that refuses only when it counts (racing requests
// filled it since it was read, or a new key met a bucket full of keys at
// their limit: Config.Overflow) refuses the request, and the limits
// counted before it keep their count. One Limiter given twice for the
// same key of a request is checked, counted and listed once. Give each
// Limiter of a route its own Config.Name: the fields name a policy by it,
// and two called "default" are two items a client cannot tell apart.
// Middlewares with other handlers
// between them cannot know of each other: each checks and counts its own
// limits when the request reaches it, and appends its items to the fields
// the outer one wrote.
//
// For a service behind a proxy or load balancer, RemoteIP is the proxy's
// address: key by ClientIP with the proxies you trust, or put SketchProxy
// in front (its client_ip settings, sketchproxy/README.md).
func Middleware(l *Limiter, key func(*http.Request) string, opts ...Option) func(http.Handler) http.Handler {
	if l == nil || key == nil {
		panic("limit: Middleware needs a Limiter and a key function: got a nil one")
	}
	var o options
	o.checks = []check{{l: l, key: key}}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	for i := range o.checks {
		if o.checks[i].skip == nil {
			o.checks[i].skip = o.skip
		}
	}
	return func(next http.Handler) http.Handler {
		h := &handler{options: o, next: next}
		if in, ok := next.(*handler); ok {
			// Directly nested: one handler checks both sets of limits
			// together, the outer's first. The inner's refusal handler is
			// the more specific one.
			h.checks = append(append([]check(nil), o.checks...), in.checks...)
			h.next = in.next
			h.legacy = o.legacy || in.legacy
			if in.refused != nil {
				h.refused = in.refused
			}
		}
		return h
	}
}

// Option configures a Middleware. A nil Option does nothing; an Option
// is a plain function value, safe to share between Middlewares.
type Option func(*options)

type options struct {
	checks  []check
	skip    func(*http.Request) bool
	refused func(http.ResponseWriter, *http.Request, Decision)
	legacy  bool
}

// check is one limit of a Middleware.
type check struct {
	l    *Limiter
	key  func(*http.Request) string
	skip func(*http.Request) bool // nil: never
}

// Also adds the limit of l, keyed by key, to those the Middleware checks
// together (see Middleware, Several limits): for example a limit per client
// address beside one per API key. It panics if l or key is nil.
func Also(l *Limiter, key func(*http.Request) string) Option {
	if l == nil || key == nil {
		panic("limit: Also needs a Limiter and a key function: got a nil one")
	}
	return func(o *options) { o.checks = append(o.checks, check{l: l, key: key}) }
}

// Skip exempts the requests for which skip returns true from the
// Middleware's limits (those of its own Also included): they reach the
// handler uncounted and without the fields. A request without the key its
// limit needs (no API key) is such a request, unless the requests without
// it should share one limit: a key function's "" is a key like any other.
func Skip(skip func(*http.Request) bool) Option {
	return func(o *options) { o.skip = skip }
}

// OnRefused replaces the answer to a refused request: refused is called,
// instead of the 429 with its text body, with the fields (RateLimit-Policy,
// RateLimit, Retry-After) already set on w's header, and d the refusing
// limit's Decision (of several, the one with the longest wait). It writes
// the status and body; the request is not passed on.
func OnRefused(refused func(w http.ResponseWriter, r *http.Request, d Decision)) Option {
	return func(o *options) { o.refused = refused }
}

// LegacyHeaders adds the X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset fields that clients written for GitHub's API,
// go-chi/httprate and ulule/limiter read: the limit's q, its r and the Unix
// time in seconds when more quota comes (now plus t). They hold one limit:
// of several, the refusing one with the longest wait, or if none refused
// the one with the fewest requests left.
func LegacyHeaders() Option {
	return func(o *options) { o.legacy = true }
}

// handler is a Middleware's http.Handler.
type handler struct {
	options
	next http.Handler
}

// checked is one limit's part of a request's answer.
type checked struct {
	c   *check
	key string
	d   Decision
	now time.Time
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var buf [2]checked
	cs := buf[:0]
	for i := range h.checks {
		c := &h.checks[i]
		if c.skip != nil && c.skip(r) {
			continue
		}
		k := c.key(r)
		if !slices.ContainsFunc(cs, func(o checked) bool { return o.c.l == c.l && o.key == k }) {
			// The same Limiter given twice for one key (a Middleware
			// nested in another of the same limit) is one limit: checked
			// and counted once, listed once.
			cs = append(cs, checked{c: c, key: k})
		}
	}
	if len(cs) == 0 {
		h.next.ServeHTTP(w, r)
		return
	}
	ok := true
	if len(cs) == 1 {
		cs[0].now = cs[0].c.l.now()
		cs[0].d = cs[0].c.l.Decide(cs[0].now, cs[0].key, 1)
		ok = cs[0].d.Allowed
	} else {
		// Read every limit first: if one refuses, none counts.
		for i := range cs {
			cs[i].now = cs[i].c.l.now()
			cs[i].d = cs[i].c.l.peek(cs[i].now, cs[i].key, 1)
			ok = ok && cs[i].d.Allowed
		}
		if ok {
			for i := range cs {
				if cs[i].d = cs[i].c.l.Decide(cs[i].now, cs[i].key, 1); !cs[i].d.Allowed {
					ok = false
					break // the rest keep what was read: not counted
				}
			}
		}
	}
	hd := w.Header()
	binding := 0 // the limit the legacy fields and OnRefused report
	for i := range cs {
		cs[i].c.l.AddFields(hd, cs[i].d)
		if binds(cs[i].d, cs[binding].d) {
			binding = i
		}
	}
	if h.legacy {
		cs[binding].c.l.setLegacy(hd, cs[binding].d, cs[binding].now)
	}
	if ok {
		h.next.ServeHTTP(w, r)
		return
	}
	if h.refused != nil {
		h.refused(w, r, cs[binding].d)
		return
	}
	http.Error(w, "too many requests: retry after "+hd.Get("Retry-After")+" s", http.StatusTooManyRequests)
}

// binds reports whether decision a says more about a request's answer
// than b: a refusal over an admission, the longer wait of two refusals,
// the fewer requests left of two admissions.
func binds(a, b Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	if !a.Allowed {
		return a.RetryAfter > b.RetryAfter
	}
	return a.Remaining < b.Remaining
}

// AddFields adds d's part of the fields Middleware writes to h, for a
// handler of its own: the limit's item of the RateLimit-Policy field and
// d's item of the RateLimit field, each appended to the field's items if
// it has some (one field, items joined by commas, as the draft lists
// several policies), and for a refusal, Retry-After: d's wait in whole
// seconds (at least 1), or the longer one h holds already. d is a
// Decision of l for one request.
func (l *Limiter) AddFields(h http.Header, d Decision) {
	addItem(h, hdrPolicy, l.policy)
	addItem(h, hdrRateLimit, l.item(d))
	if !d.Allowed {
		wait := rate.Seconds(d.RetryAfter)
		if v, err := strconv.ParseInt(h.Get(hdrRetryAfter), 10, 64); err == nil && v > wait {
			wait = v
		}
		h[hdrRetryAfter] = []string{strconv.FormatInt(wait, 10)}
	}
}

// addItem appends item to the list field name of h, as one field.
func addItem(h http.Header, name, item string) {
	if v := h[name]; len(v) > 0 {
		h[name] = []string{strings.Join(v, ", ") + ", " + item}
		return
	}
	h[name] = []string{item}
}

// setLegacy sets the X-RateLimit fields for decision d, taken at now.
func (l *Limiter) setLegacy(h http.Header, d Decision, now time.Time) {
	r, t := min(int64(d.Remaining), l.lim.Q), rate.Seconds(d.Reset)
	if !d.Allowed {
		r, t = 0, rate.Seconds(d.RetryAfter)
	}
	h["X-Ratelimit-Limit"] = []string{strconv.FormatInt(l.lim.Q, 10)}
	h["X-Ratelimit-Remaining"] = []string{strconv.FormatInt(r, 10)}
	h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(now.Unix()+t, 10)}
}

// RemoteIP is the client address of r's connection, r.RemoteAddr without
// its port ("192.0.2.1", "2001:db8::1"): a key for Middleware where
// clients connect directly. Behind a proxy it is the proxy's address (see
// Middleware and ClientIP). Each IPv6 address is its own key; a client
// that rotates through its /64 needs ClientIP with IPv6Prefix(64).
//
// On a Unix socket there is no address: net/http gives every peer the
// same RemoteAddr ("@" on Linux), which RemoteIP returns as it is, so all
// of the socket's requests share one key and one limit. A server behind a
// proxy that connects over a socket keys by ClientIP with
// TrustProxies("unix").
func RemoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr // no port: an address as it is
	}
	return host
}

// The fields' canonical keys (http.CanonicalHeaderKey), set directly.
const (
	hdrPolicy     = "Ratelimit-Policy"
	hdrRateLimit  = "Ratelimit"
	hdrRetryAfter = "Retry-After"
)

// setPolicy builds the RateLimit-Policy field: the quoted name, q and w.
func (l *Limiter) setPolicy(name string) {
	if name == "" {
		name = "default"
	}
	l.quoted = strconv.Quote(name)
	l.policy = l.lim.PolicyItem(l.quoted)
}

// item is the RateLimit field for decision d: r is the requests left (at
// most q), t the seconds until more quota, or until the refused request
// fits.
func (l *Limiter) item(d Decision) string {
	r, t := min(int64(d.Remaining), l.lim.Q), rate.Seconds(d.Reset)
	if !d.Allowed {
		r, t = 0, rate.Seconds(d.RetryAfter)
	}
	return string(rate.AppendItem(make([]byte, 0, len(l.quoted)+24), l.quoted, r, t))
}
