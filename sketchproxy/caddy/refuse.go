package caddyepochsketch

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Refusals.
//
// A refused request gets 429 with Retry-After (the wait after which every
// zone it matched admits it again, engine.Decision.Retry, lengthened by
// the jitter if one is set), RateLimit-Policy and RateLimit. The handler
// sets these on the response, with {http.epochsketch.zone} and
// {http.epochsketch.retry_after}, and then either returns the 429 as a
// caddyhttp.HandlerError for error routes (handle_errors) to answer, or
// writes the answer itself with a problem+json body (RFC 9457), as
// SketchProxy's proxy does. It writes it itself wherever a returned error
// would get Caddy's bare status and no body (errorMode says where).

// errorMode is where a handler's refusals go.
type errorMode uint8

const (
	// writeRefusals: there are no error routes to answer them, or the
	// handler is in error routes, where an error it returned would never
	// be handled (Caddy logs it and answers the first error's status,
	// empty).
	writeRefusals errorMode = iota
	// returnRefusals: an enclosing subroute has error routes of its own
	// (JSON only); they see the error first.
	returnRefusals
	// askErrorRoutes: only the server has error routes. They are matched
	// per request (a site's handle_errors holds only that site's
	// requests; handle_errors 404 holds only 404s), so each refusal asks
	// whether any of them would take it (errorRoutesTake).
	askErrorRoutes
)

// errorModeOf is where refusals of a handler at loc go.
func errorModeOf(loc location) errorMode {
	switch {
	case loc.inErrors:
		return writeRefusals
	case loc.subErrors:
		return returnRefusals
	case loc.srv != nil && loc.srv.Errors != nil && len(loc.srv.Errors.Routes) > 0:
		return askErrorRoutes
	}
	return writeRefusals
}

// returnsError reports whether the handler returns err (a 429 or a 400
// for r) rather than writing the answer itself.
func (h *Handler) returnsError(r *http.Request, err caddyhttp.HandlerError) bool {
	switch h.asErrors {
	case returnRefusals:
		return true
	case askErrorRoutes:
		return errorRoutesTake(h.loc.srv.Errors, r, err)
	}
	return false
}

// errorRoutesTake reports whether the server's error routes might answer
// err for r: false only if none of them can, when Caddy would answer
// err's bare status. It asks as Caddy's server will: of the request as the
// client sent it (Caddy restores its method and URL before the error
// routes), with err in its context and the {http.error.*} placeholders
// set, which the Caddyfile's handle_errors <codes> matches on.
func errorRoutesTake(errs *caddyhttp.HTTPErrorConfig, r *http.Request, err caddyhttp.HandlerError) bool {
	r2 := *r
	if orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && orig.URL != nil {
		u := *orig.URL
		r2.Method, r2.RemoteAddr, r2.RequestURI, r2.URL = orig.Method, orig.RemoteAddr, orig.RequestURI, &u
	}
	req := errs.WithError(&r2, err)
	// WithError sets the placeholders in the request's replacer; a
	// returned error gets them set again by Caddy, and a written answer
	// must not show them.
	defer func() {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			repl.DeleteByPrefix("http.error")
		}
	}()
	return routesTake(errs.Routes, req)
}

// routesTake reports whether routes might write an answer to r: whether
// a route that matches r holds a handler that is not a subroute, or a
// subroute whose routes might. A subroute none of whose routes match
// passes r on, as does a route that only holds such subroutes, unless it
// is terminal. It errs towards true: a matcher that fails, or any other
// handler (which might write or not), counts as an answer.
func routesTake(routes caddyhttp.RouteList, r *http.Request) bool {
	for i := range routes {
		rt := &routes[i]
		if ok, err := rt.MatcherSets.AnyMatchWithError(r); err != nil {
			return true
		} else if !ok {
			continue
		}
		for _, hd := range rt.Handlers {
			sr, ok := hd.(*caddyhttp.Subroute)
			if !ok || sr.Errors != nil || routesTake(sr.Routes, r) {
				return true
			}
		}
		if rt.Terminal {
			return false
		}
	}
	return false
}

// Placeholders a refusal sets, for error routes and logs.
const (
	zonePlaceholder  = "http.epochsketch.zone"
	retryPlaceholder = "http.epochsketch.retry_after"
)

// refusalError is the error a refusal or a bad key returns to Caddy: its
// message is the problem's detail.
type refusalError struct{ detail string }

func (e *refusalError) Error() string { return "epochsketch: " + e.detail }

// problem is an RFC 9457 problem details body, with the fields
// SketchProxy's proxy gives a refusal.
type problem struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail"`
	Rule       string   `json:"rule,omitempty"`
	Limit      string   `json:"limit,omitempty"`
	Outcome    string   `json:"outcome,omitempty"`
	RetryAfter int64    `json:"retry_after,omitempty"`
	Level      float64  `json:"level,omitempty"`
	Violated   []string `json:"violated-policies,omitempty"`
}

// quotaExceeded is the draft's problem type for a client over its quota.
const quotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// refuse answers a refused request (see Refusals).
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, repl *caddy.Replacer, d *engine.Decision) error {
	v := &d.Worst
	retry := d.Retry
	if h.Jitter > 0 && retry > 0 {
		retry += time.Duration(h.rand() * h.Jitter * float64(retry))
	}
	secs := rate.Seconds(retry)
	hd := w.Header()
	h.setFields(hd, r, &d.Fields, true)
	hd.Set("Retry-After", strconv.FormatInt(secs, 10))
	hd.Set("Cache-Control", "no-store")
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		// The body is not read: without this the server would wait for
		// it, however slowly it is sent, before the answer goes out.
		// HTTP/2 ends the one stream instead; there Go's server turns
		// Connection: close into a GOAWAY for every request on the
		// connection.
		hd.Set("Connection", "close")
	}
	zone := ""
	if v.Rule != nil {
		zone = zoneOf(v.Rule.Name)
	}
	repl.Set(zonePlaceholder, zone)
	repl.Set(retryPlaceholder, secs)
	p := problem{
		Type: "about:blank", Title: http.StatusText(http.StatusTooManyRequests), Status: http.StatusTooManyRequests,
		Rule: zone, Outcome: v.Out.String(), RetryAfter: secs, Level: math.Round(v.Level*100) / 100,
		Detail: fmt.Sprintf("zone %q: over its limit; retry after %d s", zone, secs),
	}
	if l := v.Limit; l != nil {
		p.Type, p.Limit, p.Violated = quotaExceeded, l.Name, []string{l.Policy}
		p.Detail = fmt.Sprintf("zone %q: %s requests per %v; retry after %d s",
			zone, strconv.FormatFloat(l.Requests, 'f', -1, 64), l.Per, secs)
	}
	h.logRefusal(r, v, zone, secs)
	return h.answer(w, r, &p)
}

// badKey answers a request whose key for zone z cannot be read safely
// (keys.go): 400, through the error routes where they would answer it.
func (h *Handler) badKey(w http.ResponseWriter, r *http.Request, z *zoneRef, why string) error {
	detail := fmt.Sprintf("zone %q: %s: send it once", z.name, why)
	if ce := h.logger.Check(zap.InfoLevel, "epochsketch bad key"); ce != nil {
		ce.Write(zap.String("zone", z.name), zap.String("why", why), zap.String("remote_ip", remoteIP(r)), zap.String("client_ip", clientIP(r)))
	}
	return h.answer(w, r, &problem{Type: "about:blank", Title: http.StatusText(http.StatusBadRequest), Status: http.StatusBadRequest, Detail: detail})
}

// answer sends every answer the handler gives in next's place, p: returned
// as a caddyhttp.HandlerError with p's status where error routes would
// answer it (returnsError), else written whole as problem+json.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, p *problem) error {
	if err := caddyhttp.Error(p.Status, &refusalError{p.Detail}); h.returnsError(r, err) {
		return err
	}
	body, _ := json.Marshal(p)
	body = append(body, '\n')
	hd := w.Header()
	hd.Set("Content-Type", "application/problem+json")
	hd.Set("Cache-Control", "no-store")
	hd.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(p.Status)
	w.Write(body)
	return nil
}

// logRefusal logs a refusal at info level: at most logsPerSecond lines a
// second for each zone, the next line saying how many were left out.
func (h *Handler) logRefusal(r *http.Request, v *engine.Verdict, zone string, secs int64) {
	ce := h.logger.Check(zap.InfoLevel, "epochsketch refusal")
	if ce == nil {
		return
	}
	var logs *engine.LogLimiter
	for _, z := range h.zones {
		if z.name == zone {
			logs = &z.state.logs
		}
	}
	var skipped int64
	if logs != nil {
		var ok bool
		if ok, skipped = logs.Allow(h.eng.Now(), logsPerSecond); !ok {
			return
		}
	}
	key := v.Key
	if !h.LogKey {
		key = display(key)
	}
	fields := []zap.Field{
		zap.String("zone", zone), zap.String("outcome", v.Out.String()), zap.String("key", key),
		zap.String("remote_ip", remoteIP(r)), zap.String("client_ip", clientIP(r)),
		zap.String("method", r.Method), zap.Int64("retry_after_s", secs),
	}
	if v.Limit != nil {
		fields = append(fields, zap.Uint32("estimate", v.Est), zap.Uint32("threshold", v.Theta))
	}
	if skipped > 0 {
		fields = append(fields, zap.Int64("log_lines_skipped", skipped))
	}
	ce.Write(fields...)
}

// redact keys the hash that stands for keys in logs: random per process.
var redact = func() (k [32]byte) {
	rand.Read(k[:])
	return k
}()

// display is a key as the log shows it without log_key: "k:" and the
// first 12 hex digits of its HMAC-SHA256 under a per-process key, so that
// no address or API key appears whole, and one client's lines can still
// be followed while Caddy runs (as SketchProxy's logs show keys).
func display(key string) string { return engine.Label(redact[:], key) }

// remoteIP is the connection's address without its port, as Caddy's
// access log writes remote_ip.
func remoteIP(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}

// clientIP is the client's address as Caddy resolved it ({client_ip}:
// the connection's, or one from X-Forwarded-For past trusted_proxies), as
// Caddy's access log writes client_ip; the connection's where Caddy set
// none (outside a server).
func clientIP(r *http.Request) string {
	if ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string); ip != "" {
		return ip
	}
	return remoteIP(r)
}
