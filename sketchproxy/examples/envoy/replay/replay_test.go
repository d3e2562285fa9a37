package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy"
)

// serveExample serves examples/envoy/sketchproxy.yaml's envoy_rls on a
// free port, on a manual clock, and returns its address.
func serveExample(t *testing.T) string {
	t.Helper()
	cfg, err := sketchproxy.LoadConfig(filepath.Join("..", "sketchproxy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_000, 0)) // a whole minute: no halving during the test
	mw, err := sketchproxy.New(cfg, http.NotFoundHandler(), sketchproxy.Options{Clock: clk, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	mw.RegisterRateLimitService(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Stop(); mw.Close() })
	return ln.Addr().String()
}

// replay runs the command and returns its output, one line per request
// after the plan's lines.
func replay(t *testing.T, args ...string) (out, errs string, code int) {
	t.Helper()
	var o, e bytes.Buffer
	// The answers are what is tested, not how fast a loaded machine gives
	// them: Envoy's 20 ms would read a slow answer as a failure.
	code = run(append([]string{"-envoy", filepath.Join("..", "envoy.yaml"), "-timeout", "10s"}, args...), &o, &e)
	return o.String(), e.String(), code
}

// answers lists what Envoy would do for each request replayed.
func answers(out string) []string {
	var got []string
	for _, m := range regexp.MustCompile(`(?m)^request \d+: (OK|OVER_LIMIT|no descriptors|error|rejected)`).FindAllStringSubmatch(out, -1) {
		got = append(got, m[1])
	}
	return got
}

// The example's Envoy configuration, read and validated with Envoy's own
// Go types, run against SketchProxy on the example's config through
// Envoy's Go client: each route's actions make the descriptors the
// domains expect, and the limits hold.
func TestReplay(t *testing.T) {
	addr := serveExample(t)

	out, errs, code := replay(t, "-rls", addr, "-n", "7", "-client", "203.0.113.1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, `route prefix "/", domain edge, 1 descriptors`) || !strings.Contains(out, "descriptor [remote_address=203.0.113.1]") {
		t.Errorf("the plan for /:\n%s", out)
	}
	if got := strings.Join(answers(out), " "); got != "OK OK OK OK OK OVER_LIMIT OVER_LIMIT" {
		t.Errorf("7 requests from one client at 5 a minute: %s\n%s", got, out)
	}
	if !regexp.MustCompile(`(?m)^request 6: OVER_LIMIT: Envoy answers 429; remaining 0; headers .*Retry-After: \d+`).MatchString(out) {
		t.Errorf("the 6th request's answer:\n%s", out)
	}

	// The generate limit holds in every spelling Envoy sends of its path:
	// :path carries the query (a request_headers action on it made
	// /v1/generate?x=1 a value no descriptor matched, so the limit was
	// skipped), and normalize_path and merge_slashes fold the others.
	for _, c := range []struct{ key, path string }{
		{"k1", "/v1/generate"}, {"k2", "/v1/generate?x=1"}, {"k3", "//v1//generate"}, {"k4", "/v1/./x/../generate/"}, {"k5", "/v1/gen%65rate?a=b"},
	} {
		out, _, _ = replay(t, "-rls", addr, "-n", "11", "-path", c.path, "-H", "X-API-Key: "+c.key)
		if !strings.Contains(out, `route prefix "/v1/", domain api, 2 descriptors`) || !strings.Contains(out, "descriptor [api_key="+c.key+", path=/v1/generate]") {
			t.Errorf("the plan for %s:\n%s", c.path, out)
		}
		if got := strings.Join(answers(out), " "); got != strings.TrimSpace(strings.Repeat("OK ", 10))+" OVER_LIMIT" {
			t.Errorf("11 generate calls at 10 a minute as %s: %s\n%s", c.path, got, out)
		}
	}
	// Another path of the API: the key's own limit only.
	out, _, _ = replay(t, "-rls", addr, "-n", "11", "-path", "/v1/generated", "-H", "X-API-Key: k6")
	if !strings.Contains(out, "domain api, 1 descriptors") || slicesCount(answers(out), "OK") != 11 {
		t.Errorf("/v1/generated:\n%s", out)
	}
	// An escaped slash never reaches the filter: Envoy answers 400.
	out, _, _ = replay(t, "-rls", addr, "-path", "/v1%2Fgenerate", "-H", "X-API-Key: k7")
	if got := answers(out); len(got) != 1 || got[0] != "rejected" {
		t.Errorf("/v1%%2Fgenerate: %v\n%s", got, out)
	}
	out, _, _ = replay(t, "-rls", addr, "-path", "/v1/generate")
	if got := answers(out); len(got) != 1 || got[0] != "no descriptors" {
		t.Errorf("without X-API-Key: %v\n%s", got, out)
	}

	// The service unreachable: failure_mode_deny is off in the example,
	// so Envoy forwards.
	out, _, _ = replay(t, "-rls", "127.0.0.1:1")
	if !strings.Contains(out, "failure_mode_deny is off, so Envoy forwards the request") {
		t.Errorf("the service unreachable:\n%s", out)
	}
}

func slicesCount(s []string, v string) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// A configuration Envoy would reject is refused with the reason.
func TestReplayRejectsInvalidEnvoyConfig(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile(filepath.Join("..", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct{ from, to, want string }{
		"unknown field": {"failure_mode_deny: false", "failure_mode_denny: false", `unknown field "failure_mode_denny"`},
		"invalid value": {"port_value: 8081", "port_value: 80810", "PortValue: value must be less than or equal to 65535"},
	} {
		bad := strings.Replace(string(src), c.from, c.to, 1)
		if bad == string(src) {
			t.Fatalf("%s: envoy.yaml has no %q", name, c.from)
		}
		p := filepath.Join(dir, "envoy.yaml")
		os.WriteFile(p, []byte(bad), 0o644)
		var o, e bytes.Buffer
		if code := run([]string{"-envoy", p, "-rls", "127.0.0.1:1"}, &o, &e); code != 1 || !strings.Contains(e.String(), c.want) {
			t.Errorf("%s: exit %d, %q; want 1 and %q", name, code, e.String(), c.want)
		}
	}
}

// The example's rate-limit cluster health-checks SketchProxy's gRPC health
// service under the name SketchProxy answers for, often enough to see a
// draining replica's NOT_SERVING within its drain (-drain 10s in the
// Kubernetes example), and the service answers SERVING under that name.
func TestExampleHealthCheck(t *testing.T) {
	bs, err := loadBootstrap(filepath.Join("..", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var hc *corev3.HealthCheck
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == "sketchproxy_rls" && len(c.GetHealthChecks()) == 1 {
			hc = c.GetHealthChecks()[0]
		}
	}
	if hc == nil || hc.GetGrpcHealthCheck() == nil {
		t.Fatalf("the sketchproxy_rls cluster has no gRPC health check: Envoy would not see a draining replica's NOT_SERVING")
	}
	name := hc.GetGrpcHealthCheck().GetServiceName()
	if name != rlsv3.RateLimitService_ServiceDesc.ServiceName {
		t.Errorf("health check service_name %q, want %q", name, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
	if seen := hc.GetInterval().AsDuration()*time.Duration(hc.GetUnhealthyThreshold().GetValue()) + hc.GetTimeout().AsDuration(); seen >= 10*time.Second {
		t.Errorf("a draining replica is seen after up to %v: not within a 10 s drain", seen)
	}
	conn, err := grpc.NewClient(serveExample(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: name})
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %q: %v, %v; want SERVING", name, resp, err)
	}
}
