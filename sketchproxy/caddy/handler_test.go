package caddyepochsketch

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// provision provisions a handler of one zone keyed by X-Key, as Caddy
// would, and cleans it up at the test's end.
func provision(t *testing.T, zone string, events float64) *Handler {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	t.Cleanup(cancel)
	h := &Handler{Zones: map[string]*Zone{zone: {Key: "{http.request.header.X-Key}", Events: events, Window: caddy.Duration(time.Hour)}}}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Cleanup() })
	return h
}

// serve runs a request with key through the handlers in order, as a
// Caddy route would, in front of a handler that answers 200.
func serve(hs []*Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "http://example.com/x?y=1", nil)
	r.Header.Set("X-Key", key)
	repl := caddy.NewReplacer()
	r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
	caddyhttp.NewTestReplacer(r)
	w := httptest.NewRecorder()
	var next caddyhttp.Handler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		w.WriteHeader(http.StatusOK)
		return nil
	})
	for i := len(hs) - 1; i >= 0; i-- {
		h, after := hs[i], next
		next = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return h.ServeHTTP(w, r, after) })
	}
	if err := next.ServeHTTP(w, r); err != nil {
		w.Code = 599
	}
	return w
}

// Two stacked handlers from many goroutines (under -race in make test):
// each key gets exactly its limit of the stricter zone, and every answer
// carries both zones' policies. (Each handler decides alone: the outer one
// counts the requests the inner one refuses, so 6 stay within its 8.)
func TestStackedHandlersConcurrent(t *testing.T) {
	hs := []*Handler{provision(t, "outer", 8), provision(t, "inner", 4)}
	const keys, each = 16, 6
	var wg sync.WaitGroup
	admitted := make([]int, keys)
	errs := make(chan string, keys)
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				w := serve(hs, fmt.Sprintf("key-%d", k))
				if w.Code == http.StatusOK {
					admitted[k]++
				}
				pol := w.Header().Get("RateLimit-Policy")
				if !strings.Contains(pol, `"outer-`) || !strings.Contains(pol, `"inner-`) {
					errs <- fmt.Sprintf("%d: RateLimit-Policy %q: want both zones", w.Code, pol)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	for k, n := range admitted {
		if n != 4 {
			t.Errorf("key-%d: %d of %d admitted, want 4 (the inner zone's limit)", k, n, each)
		}
	}
}

// The pool: a handler with the same zones shares the Middleware (a reload
// keeps the counts); other zones get their own; the last Cleanup closes it.
func TestPoolAcrossReloads(t *testing.T) {
	a := provision(t, "z", 3)
	for range 3 {
		serve([]*Handler{a}, "k")
	}
	b := provision(t, "z", 3) // the reload's new handler, before the old one's Cleanup
	if b.mw != a.mw {
		t.Fatal("the same zones got a new Middleware: a reload would lose the counts")
	}
	a.Cleanup()
	if w := serve([]*Handler{b}, "k"); w.Code != http.StatusTooManyRequests {
		t.Errorf("after the old handler's Cleanup: %d, want 429 (counts kept)", w.Code)
	}
	c := provision(t, "z", 4)
	if c.mw == b.mw {
		t.Error("other zones share a Middleware")
	}
	if n, ok := pool.References(b.poolKey); !ok || n != 1 {
		t.Errorf("references to b's Middleware: %d, %v; want 1", n, ok)
	}
	key := b.poolKey
	b.Cleanup()
	if _, ok := pool.References(key); ok {
		t.Error("the Middleware stays in the pool after its last Cleanup")
	}
}

func TestClientPrefix(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"", "-"},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: tc.ip}))
		if got := clientPrefix(r); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.ip, got, tc.want)
		}
	}
}

// A zone keyed on {http.epochsketch.client_prefix}: two addresses of one
// IPv6 /64 share a count, another /64 has its own.
func TestClientPrefixZone(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	h := &Handler{Zones: map[string]*Zone{"net": {Key: "{http.epochsketch.client_prefix}", Events: 1, Window: caddy.Duration(time.Hour)}}}
	if err := h.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer h.Cleanup()
	ok := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return nil })
	var codes []int
	for _, ip := range []string{"2001:db8::1", "2001:db8::2", "2001:db8:0:1::1"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		repl := caddy.NewReplacer()
		c := context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl)
		r = r.WithContext(context.WithValue(c, caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: ip}))
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, ok); err != nil {
			t.Fatal(err)
		}
		codes = append(codes, w.Code)
	}
	if fmt.Sprint(codes) != "[200 429 200]" {
		t.Errorf("one /64 twice, then another /64: %v, want [200 429 200]", codes)
	}
}
