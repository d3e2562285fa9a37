package caddyepochsketch

import (
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch/sketchproxy"
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
// "/api\x", which IIS and some routers read as /api/x. It matches more
// requests than the path matcher, never fewer, and changes nothing of the
// request: use it to select what a zone counts, not what a handler serves.
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

// MatchWithError reports whether the path, or its fold, matches a pattern.
func (m MatchPath) MatchWithError(r *http.Request) (bool, error) {
	pm := caddyhttp.MatchPath(m)
	if ok, err := pm.MatchWithError(r); ok || err != nil {
		return ok, err
	}
	p := r.URL.Path
	if strings.IndexByte(p, '\\') >= 0 {
		p = strings.ReplaceAll(p, `\`, "/")
	}
	folded := sketchproxy.FoldPath(p)
	if folded == r.URL.Path {
		return false, nil
	}
	// A copy of the request with the folded path: the request itself is
	// left as it is.
	u := *r.URL
	u.Path, u.RawPath = folded, ""
	r2 := *r
	r2.URL = &u
	return pm.MatchWithError(&r2)
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
