package caddyepochsketch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// epochsketch_path matches what Caddy's path matcher matches, and the
// spellings SketchProxy's rules fold, which some upstreams serve as the
// same path; it leaves the request as it is.
func TestMatchPath(t *testing.T) {
	var m MatchPath
	if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser("epochsketch_path /API/*")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		target string
		want   bool
	}{
		{"/api/x", true},
		{"/API/x", true},
		{"/api;jsessionid=1/x", true},
		{"/api./x", true},
		{"/api. ./x", true},
		{"/api::$DATA/x", true},
		{"/x/..;/api/y", true},
		{`/api\x`, true},
		{"/a/../api/x", true},
		{"//api//x", true},
		{"/apix", false},
		{"/other/api/x", false},
		{"/ap;i/x", false},
	} {
		r := httptest.NewRequest(http.MethodGet, "http://example.com/", nil)
		r.URL.Path, r.URL.RawPath = tc.target, ""
		r = prepared(r)
		got, err := m.MatchWithError(r)
		if err != nil || got != tc.want {
			t.Errorf("%q: %v %v, want %v", tc.target, got, err, tc.want)
		}
		if r.URL.Path != tc.target {
			t.Errorf("%q: the matcher changed the request's path to %q", tc.target, r.URL.Path)
		}
	}
}

// epochsketch_path also matches the path the client sent, before a
// rewrite (try_files behind a front controller, handle_path), and its
// fold: Caddy keeps that request in the context.
func TestMatchPathOriginal(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	m := MatchPath{"/login"}
	if err := m.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sent, rewritten string
		want            bool
	}{
		{"/login", "/index.php", true},
		{"/login;a=1", "/index.php", true},
		{"/other", "/login", true},
		{"/other", "/index.php", false},
	} {
		sent := httptest.NewRequest(http.MethodGet, "http://example.com"+tc.sent, nil)
		r := sent.WithContext(context.WithValue(sent.Context(), caddyhttp.OriginalRequestCtxKey, *sent))
		r.URL = &url.URL{Path: tc.rewritten}
		r = prepared(r)
		if got, err := m.MatchWithError(r); err != nil || got != tc.want {
			t.Errorf("sent %s, rewritten to %s: %v %v, want %v", tc.sent, tc.rewritten, got, err, tc.want)
		}
		if r.URL.Path != tc.rewritten {
			t.Errorf("the matcher changed the request's path to %q", r.URL.Path)
		}
	}
}
