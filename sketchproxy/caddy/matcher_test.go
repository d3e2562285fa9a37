package caddyepochsketch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch"
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

// A zone's `method` matcher matches a request as every method SketchProxy
// judges it as: HEAD under GET, "delete" under DELETE, and a POST whose
// override header or _method names DELETE under DELETE (frameworks route
// it as DELETE), while a plain POST stays outside. Caddy's matcher alone
// compares names exactly, and each of these passed a zone of 1 an hour.
// The next handler gets the request as it came.
func TestZoneMethod(t *testing.T) {
	for _, c := range []struct {
		name, zone, method, target string
		header                     []string
		want                       string
	}{
		{"HEAD under GET", "GET", "HEAD", "/x", nil, "200 429"},
		{"delete under DELETE", "DELETE", "delete", "/x", nil, "200 429"},
		{"X-HTTP-Method-Override", "DELETE", "POST", "/x", []string{"X-HTTP-Method-Override", "DELETE"}, "200 429"},
		{"X-HTTP-Method", "DELETE", "POST", "/x", []string{"X-HTTP-Method", "delete"}, "200 429"},
		{"X-Method-Override", "DELETE", "POST", "/x", []string{"X-Method-Override", "DELETE"}, "200 429"},
		{"_method", "DELETE", "POST", "/x?_method=DELETE", nil, "200 429"},
		{"a plain POST", "DELETE", "POST", "/x", nil, "200 200"},
		{"an override on a GET", "DELETE", "GET", "/x?_method=DELETE", nil, "200 200"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := newConfig(t, epochsketch.NewManualClock(t0))
			z := zone(1, time.Hour)
			z.MatcherSetsRaw = caddyhttp.RawMatcherSets{{"method": []byte(`["` + c.zone + `"]`)}}
			h := cfg.provision(one("m", z))
			var got []string
			for range 2 {
				r := httptest.NewRequest(c.method, "http://example.com"+c.target, nil)
				r.Header.Set("X-Key", "k")
				for i := 0; i+1 < len(c.header); i += 2 {
					r.Header.Add(c.header[i], c.header[i+1])
				}
				res := serve([]*Handler{h}, prepared(r))
				got = append(got, strconv.Itoa(res.Code))
				if res.reached != nil && res.reached.Method != c.method {
					t.Errorf("the next handler got a %s, want the %s sent", res.reached.Method, c.method)
				}
			}
			if s := strings.Join(got, " "); s != c.want {
				t.Errorf("a %s of %s twice under `method %s` at 1 an hour: %s, want %s", c.method, c.target, c.zone, s, c.want)
			}
		})
	}
}
