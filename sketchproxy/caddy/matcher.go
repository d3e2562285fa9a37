package caddyepochsketch

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

func init() {
	caddy.RegisterModule(MatchPath{})
}

// MatchPath is http.matchers.epochsketch_path: Caddy's path matcher
// (the same patterns, in any case) that also matches the path as
// SketchProxy's own path rules fold it (sketchproxy.FoldPath): each
// segment's ";" parameters and ":" stream name cut, its trailing dots and
// spaces dropped, then cleaned. "/api;jsessionid=1/x" (Tomcat and Jetty's
// /api/x), "/api./x" and "/api::$DATA/x" (IIS's) match /api/*, as does
// "/api\x", which IIS and some routers read as /api/x. It tries the path
// the client sent as well as the path as rewritten so far (try_files,
// rewrite, handle_path): behind a front controller's try_files, /login
// reaches the handlers as /index.php, and a zone on /login must still
// judge it. It matches more requests than the path matcher, never fewer,
// and changes nothing of the request: use it to select what a zone
// counts, not what a handler serves.
//
//	@api epochsketch_path /api/*
type MatchPath []string

// CaddyModule returns the Caddy module information.
func (MatchPath) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.matchers.epochsketch_path",
		New: func() caddy.Module { return new(MatchPath) },
	}
}

// Provision lower-cases the patterns, as the path matcher does.
func (m MatchPath) Provision(ctx caddy.Context) error { return caddyhttp.MatchPath(m).Provision(ctx) }

// Match reports whether r matches (Caddy's older matcher interface).
func (m MatchPath) Match(r *http.Request) bool {
	ok, _ := m.MatchWithError(r)
	return ok
}

// MatchWithError reports whether the path, or its fold, matches a
// pattern; if not, whether the path of the request as the client sent it
// (Caddy's original request, before any rewrite) or its fold does.
func (m MatchPath) MatchWithError(r *http.Request) (bool, error) {
	if ok, err := m.match(r, r.URL); ok || err != nil {
		return ok, err
	}
	orig, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request)
	if !ok || orig.URL == nil || orig.URL.Path == r.URL.Path && orig.URL.RawPath == r.URL.RawPath {
		return false, nil
	}
	return m.match(r, orig.URL)
}

// match reports whether r with the URL u (r's own, or the original
// request's), or with u's path folded, matches a pattern. r is left as it
// is: the path matcher is given a copy.
func (m MatchPath) match(r *http.Request, u *url.URL) (bool, error) {
	pm := caddyhttp.MatchPath(m)
	r2 := r
	if u != r.URL {
		r2 = withPath(r, u, u.Path, u.RawPath)
	}
	if ok, err := pm.MatchWithError(r2); ok || err != nil {
		return ok, err
	}
	p := u.Path
	if strings.IndexByte(p, '\\') >= 0 {
		p = strings.ReplaceAll(p, `\`, "/")
	}
	folded := httpnorm.LoosePath(httpnorm.CleanPath(p)) // sketchproxy.FoldPath
	if folded == u.Path {
		return false, nil
	}
	return pm.MatchWithError(withPath(r, u, folded, ""))
}

// withPath is a copy of r whose URL is a copy of u with the path p.
func withPath(r *http.Request, u *url.URL, p, raw string) *http.Request {
	u2 := *u
	u2.Path, u2.RawPath = p, raw
	r2 := *r
	r2.URL = &u2
	return &r2
}

// UnmarshalCaddyfile reads the matcher: epochsketch_path <patterns...>.
func (m *MatchPath) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return (*caddyhttp.MatchPath)(m).UnmarshalCaddyfile(d)
}

// Interface guards.
var (
	_ caddy.Provisioner                 = MatchPath{}
	_ caddyhttp.RequestMatcherWithError = MatchPath{}
	_ caddyfile.Unmarshaler             = (*MatchPath)(nil)
)
