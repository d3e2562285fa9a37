package sketchproxy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

func TestEnvoyRLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	write("typo.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      request_per_unit: 5\n")
	write("ok.yaml", "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: SECOND, requests_per_unit: 5}\n")
	write("empty.yaml", "")
	write("unlimited.yaml", "domain: u\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: minute\n")
	for _, c := range []struct{ yaml, want string }{
		{"envoy_rls: {domains: [{domain: a, descriptors: [{key: k}]}]}\n", `main.yaml:1: envoy_rls.listen: missing`},
		{"envoy_rls: {listen: 127.0.0.1:0}\n", "no domains"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {unit: fortnight, requests_per_unit: 1}\n", `main.yaml:7: envoy_rls.domains[0].descriptors[0].rate_limit.unit: "fortnight"`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {unit: second, requests_per_unit: 2.5}\n", "want a whole number"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - {key: k, value: v}\n        - {key: k, value: v}\n", "k=v is given twice"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - {key: k, value: v, share_threshold: true}\n", `main.yaml:6: envoy_rls.domains[0].descriptors[0].share_threshold: share_threshold needs a wildcard value`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - {key: k, value: \"v*\"}\n        - {key: k, value: \"v*\"}\n", "k=v* is given twice"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {unit: second}\n", "main.yaml:7: envoy_rls.domains[0].descriptors[0].rate_limit: missing: requests_per_unit (write 0 to refuse every request)"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {unit: second, requests_per_unit: -1}\n", "want a whole number from 0"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {name: n, unit: second, requests_per_unit: 1, replaces: [{name: n}]}\n", `"n" is this limit's own name`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: a\n      descriptors:\n        - key: k\n          rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n", "missing: the name of the limit replaced"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  merge_domains: true\n  files: [ok.yaml, ok.yaml]\n", `ok.yaml:3: descriptors[0]: key "user" without a value is given twice`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - {domain: a}\n    - {domain: a}\n", `"a" is given twice`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  files: [typo.yaml]\n", "typo.yaml:6"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  files: [empty.yaml]\n", "empty.yaml: the file is empty"},
		// As envoyproxy/ratelimit: "should not specify rate limit unit when unlimited".
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  files: [unlimited.yaml]\n", `unlimited.yaml:6: descriptors[0].rate_limit.unit: "minute" with unlimited: true: remove the unit`},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  files: [missing.yaml]\n", "missing.yaml: no such file"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  files: [ok.yaml, ok.yaml]\n", `"api" is given twice: give each domain once, or set envoy_rls.merge_domains: true`},
	} {
		_, err := LoadConfig(write("main.yaml", c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %q", c.yaml, err, c.want)
		}
	}
	cfg, err := LoadConfig(write("main.yaml", "envoy_rls:\n  listen: 127.0.0.1:0\n  files: [ok.yaml]\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := b.RLS().Domain("api").Child("user", "u1"); n == nil || n.Requests() != 5 || len(b.Spec().RLSRules) != 1 {
		t.Errorf("compiled: %+v", n)
	}
	write("more.yaml", "domain: api\ndescriptors:\n  - key: ip\n    descriptors:\n      - {key: path, value: /a, rate_limit: {unlimited: true}}\n      - {key: path, value: /b, rate_limit: {unit: hour, requests_per_unit: 0}}\n")
	write("edge.yaml", "domain: edge\ndescriptors:\n  - {key: k}\n")
	cfg, err = LoadConfig(write("main.yaml", "envoy_rls:\n  listen: 127.0.0.1:0\n  merge_domains: true\n  files: [ok.yaml, more.yaml, edge.yaml]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d, n, l := cfg.EnvoyRLS.Loaded(); d != 2 || n != 5 || l != 3 {
		t.Errorf("Loaded: %d domains, %d descriptors, %d limits; want 2, 5, 3", d, n, l)
	}
}

// envoy_rls.max_connection_age is envoyproxy/ratelimit's
// GRPC_MAX_CONNECTION_AGE: 24h and a 1h grace unless set, 0s never; a
// connection past it gets a GOAWAY, and the client's next call opens a new
// one (Envoy's connections spread onto replicas started since).
func TestRLSMaxConnectionAge(t *testing.T) {
	dir := t.TempDir()
	load := func(extra string) (*Config, error) {
		p := filepath.Join(dir, "main.yaml")
		os.WriteFile(p, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  domains: [{domain: d, descriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 5}}]}]\n"+extra), 0o644)
		return LoadConfig(p)
	}
	cfg, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	if ka := cfg.EnvoyRLS.Keepalive(); ka.MaxConnectionAge != 24*time.Hour || ka.MaxConnectionAgeGrace != time.Hour {
		t.Errorf("defaults: %+v, want envoyproxy/ratelimit's 24h and 1h", ka)
	}
	if cfg, err = load("  max_connection_age: 0s\n"); err != nil || cfg.EnvoyRLS.Keepalive().MaxConnectionAge != 0 {
		t.Errorf("0s: %v, %+v; want never (0)", err, cfg)
	}
	if _, err := load("  max_connection_age: -1s\n"); err == nil || !strings.Contains(err.Error(), "main.yaml:5: envoy_rls.max_connection_age: want 0 (none) or more") {
		t.Errorf("-1s: %v", err)
	}

	cfg, err = load("  max_connection_age: 200ms\n  max_connection_age_grace: 1s\n")
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	srv := grpc.NewServer(append(RateLimitServerOptions(), grpc.KeepaliveParams(cfg.EnvoyRLS.Keepalive()))...)
	mw.RegisterRateLimitService(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{entries("k", "v")}}
	if _, err := client.ShouldRateLimit(ctx, req); err != nil {
		t.Fatal(err)
	}
	// The GOAWAY moves the client off READY: the wait is for that event,
	// bounded by ctx.
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatal("the connection was still READY after 10 s: no GOAWAY at max_connection_age")
		}
	}
	if _, err := client.ShouldRateLimit(ctx, req); err != nil {
		t.Errorf("the call after the GOAWAY, on a new connection: %v", err)
	}
}

// A program may register the service on a Middleware whose config has no
// envoy_rls (a library user's, or one a reload took it out of): every
// domain is then unknown and answered OK, as the limiter fails open,
// rather than the call taking the process down.
func TestRLSWithoutEnvoyRLSSection(t *testing.T) {
	h := newHarness(t, "rules:\n  - limits: [{requests: 1, per: 1m}]\n")
	resp, err := h.mw.rlsService().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
		t.Fatalf("a call without envoy_rls: %v, %v; want OK with one status", resp, err)
	}
	if n := h.mw.met.rls.UnknownDomain.Load(); n != 1 {
		t.Errorf("unknown domains counted: %d, want 1", n)
	}
}
