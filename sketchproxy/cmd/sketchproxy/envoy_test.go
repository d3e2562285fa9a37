package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// startEnvoyExample runs the binary on the example config, moved to free
// ports, and returns a client of its gRPC service.
func startEnvoyExample(t *testing.T) (rlsv3.RateLimitServiceClient, *grpc.ClientConn, *lockedBuffer) {
	t.Helper()
	bin := build(t)
	dir := t.TempDir()
	src, err := os.ReadFile("../../examples/envoy/sketchproxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.NewReplacer(`"127.0.0.1:8081"`, `"127.0.0.1:0"`, `admin: "127.0.0.1:9091"`, `admin: "off"`).Replace(string(src))
	if cfg == string(src) {
		t.Fatal("the example config no longer has the addresses this test moves")
	}
	os.MkdirAll(filepath.Join(dir, "ratelimit"), 0o755)
	api, _ := os.ReadFile("../../examples/envoy/ratelimit/api.yaml")
	os.WriteFile(filepath.Join(dir, "ratelimit", "api.yaml"), api, 0o644)
	path := filepath.Join(dir, "sketchproxy.yaml")
	os.WriteFile(path, []byte(cfg), 0o644)
	_, out := start(t, bin, "-config", path)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), conn, out
}

func TestBinaryEnvoyRLS(t *testing.T) {
	client, conn, out := startEnvoyExample(t)
	ctx := context.Background()
	ask := func(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := client.ShouldRateLimit(cctx, req)
		if err != nil {
			t.Fatalf("%v: %v", req, err)
		}
		return resp
	}
	header := func(resp *rlsv3.RateLimitResponse, name string) string {
		for _, h := range resp.GetResponseHeadersToAdd() {
			if strings.EqualFold(h.GetKey(), name) {
				return h.GetValue()
			}
		}
		return ""
	}
	awayFromTickEdge(30*time.Second, 10*time.Second) // 5 per minute: counts halve every 30 s

	t.Run("remote_address 5 per minute", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "203.0.113.1")}}
		for i := range 5 {
			resp := ask(t, req)
			st := resp.GetStatuses()[0]
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != uint32(4-i) {
				t.Fatalf("call %d: %v remaining %d", i+1, resp.GetOverallCode(), st.GetLimitRemaining())
			}
			if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 5 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
				t.Errorf("current limit %v", l)
			}
		}
		resp := ask(t, req)
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 {
			t.Fatalf("6th call: %v", resp)
		}
		if d := st.GetDurationUntilReset().AsDuration(); d <= 0 || d > time.Minute {
			t.Errorf("duration_until_reset %v", d)
		}
		ra := header(resp, "Retry-After")
		if ra == "" || !strings.Contains(header(resp, "RateLimit"), ";r=0;t=") || !strings.Contains(header(resp, "RateLimit-Policy"), ";q=5;w=60") {
			t.Errorf("headers %v", resp.GetResponseHeadersToAdd())
		}
		other := ask(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "203.0.113.2")}})
		if other.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("another address: %v", other.GetOverallCode())
		}
	})

	t.Run("nested descriptors", func(t *testing.T) {
		gen := desc("api_key", "k1", "path", "/v1/generate")
		for i := range 10 {
			if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{gen}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("generate %d: %v", i+1, resp)
			}
		}
		resp := ask(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{gen, desc("api_key", "k1")}})
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit().GetName() != "generate" {
			t.Errorf("11th generate with the key's own descriptor: %v", resp)
		}
		// The key alone has its own limit (100 per second), and another
		// path under the key matches no node: no limit.
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k1"), desc("api_key", "k1", "path", "/v1/list")}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK ||
			resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 100 || resp.GetStatuses()[1].GetCurrentLimit() != nil {
			t.Errorf("the key and another path: %v", resp)
		}
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{desc("api_key", "k2", "path", "/v1/generate")}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("another key: %v", resp)
		}
	})

	t.Run("shadow mode", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 600, Descriptors: []*rlv3.RateLimitDescriptor{desc("plan", "free")}}
		for i := range 3 {
			resp := ask(t, req)
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK || header(resp, "RateLimit") != "" {
				t.Fatalf("shadow call %d (1800 of 1000 an hour): %v", i+1, resp)
			}
		}
	})

	t.Run("hits_addend", func(t *testing.T) {
		req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "198.51.100.7")}}
		if resp := ask(t, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
			t.Fatalf("3 hits: %v", resp)
		}
		if resp := ask(t, req); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("3 more hits (6 of 5): %v", resp.GetOverallCode())
		}
		// A descriptor's own hits_addend wins over the request's; 0 asks
		// without counting.
		d := desc("remote_address", "198.51.100.7")
		d.HitsAddend = wrapperspb.UInt64(2)
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 50, Descriptors: []*rlv3.RateLimitDescriptor{d}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
			t.Errorf("2 hits on 3 counted: %v", resp)
		}
		d.HitsAddend = wrapperspb.UInt64(0)
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{d}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("a look without counting: %v", resp)
		}
	})

	t.Run("unknown domain", func(t *testing.T) {
		resp := ask(t, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "x")}})
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("unknown domain: %v", resp)
		}
	})

	t.Run("malformed requests", func(t *testing.T) {
		many := make([]*rlv3.RateLimitDescriptor, 65)
		for i := range many {
			many[i] = desc("remote_address", fmt.Sprint(i))
		}
		// A call that names no domain or no descriptor is malformed as a
		// whole.
		for _, c := range []struct {
			name string
			req  *rlsv3.RateLimitRequest
		}{
			{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "x")}}},
			{"no descriptors", &rlsv3.RateLimitRequest{Domain: "edge"}},
		} {
			_, err := client.ShouldRateLimit(ctx, c.req)
			if status.Code(err) != grpccodes.InvalidArgument || status.Convert(err).Message() == "" {
				t.Errorf("%s: %v, want InvalidArgument with a reason", c.name, err)
			}
		}
		// One bad descriptor is judged on its own: the call is answered,
		// with a status for each descriptor (the service's own test,
		// TestRLSEachDescriptorJudgedAlone, shows a limit beside it still
		// refusing).
		for _, c := range []struct {
			name string
			req  *rlsv3.RateLimitRequest
		}{
			{"17 entries", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc(strings.Split(strings.Repeat("k,v,", 17), ",")...)}}},
			{"an entry without a key", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("", "x")}}},
			{"65 descriptors", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: many}},
			{"a 5000-byte value", &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", strings.Repeat("x", 5000))}}},
		} {
			resp, err := client.ShouldRateLimit(ctx, c.req)
			if err != nil || len(resp.GetStatuses()) != len(c.req.GetDescriptors()) {
				t.Errorf("%s: %v, %v; want an answer for each descriptor", c.name, resp, err)
			}
		}
		// A descriptor without entries has no limit, as in
		// envoyproxy/ratelimit: OK.
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{{}}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Errorf("an empty descriptor: %v", resp)
		}
		// Control bytes, quotes and non-ASCII in a value are just bytes.
		// (Invalid UTF-8 cannot be sent: proto3 strings refuse it.)
		if resp := ask(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "\x00\n\"\\é")}}); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("odd bytes: %v", resp)
		}
	})

	t.Run("deadlines and health", func(t *testing.T) {
		dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel()
		_, err := client.ShouldRateLimit(dctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "x")}})
		if status.Code(err) != grpccodes.DeadlineExceeded {
			t.Errorf("an expired deadline: %v", err)
		}
		for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("health %q: %v %v", svc, h, err)
			}
		}
	})
	if strings.Contains(out.String(), "level=ERROR") {
		t.Errorf("errors logged:\n%s", out)
	}
}

// Counts survive a restart through the state file, as the rules' do.
func TestBinaryEnvoyRLSRestart(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`admin: "off"
state_file: %q
envoy_rls:
  listen: "127.0.0.1:0"
  domains:
    - domain: edge
      descriptors:
        - key: remote_address
          rate_limit: {unit: minute, requests_per_unit: 5}
`, filepath.Join(dir, "state"))), 0o644)
	call := func(addr string) rlsv3.RateLimitResponse_Code {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(),
			&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", "203.0.113.3")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	re := regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`)
	awayFromTickEdge(30*time.Second, 10*time.Second) // two starts and six calls
	cmd, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, re)[1]
	for i := range 5 {
		if c := call(addr); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i+1, c)
		}
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("shutdown: %v\n%s", err, out)
	}
	_, out = start(t, bin, "-config", cfg)
	if c := call(waitFor(t, out, re)[1]); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the 6th call, after a restart: %v, want OVER_LIMIT\n%s", c, out)
	}
}

// SIGHUP reloads envoy_rls's domains, files included; an invalid file keeps
// the running ones.
func TestBinaryEnvoyRLSReload(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  files: [edge.yaml]\n"), 0o644)
	domain := func(n int) {
		os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(fmt.Sprintf("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)), 0o644)
	}
	domain(100)
	cmd, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	limit := func() uint32 {
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 100 {
		t.Fatalf("limit %d, want 100", got)
	}
	domain(7)
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, out, regexp.MustCompile(`msg="config reloaded"`))
	if got := limit(); got != 7 {
		t.Errorf("after a reload: limit %d, want 7", got)
	}
	os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limt: {}\n"), 0o644)
	cmd.Process.Signal(syscall.SIGHUP)
	m := waitFor(t, out, regexp.MustCompile(`msg="reload failed: keeping the running config" err="([^"]*)"`))
	if !strings.Contains(m[1], "edge.yaml:4") {
		t.Errorf("the reload error %q does not name edge.yaml:4", m[1])
	}
	if got := limit(); got != 7 {
		t.Errorf("after an invalid reload: limit %d, want the running 7", got)
	}
}

// The binary's gRPC server ages its connections out at
// envoy_rls.max_connection_age: a connection gets a GOAWAY, and the next
// call opens a new one.
func TestBinaryEnvoyRLSMaxConnectionAge(t *testing.T) {
	bin := build(t)
	socks := holdSockets(t, "envoy_rls")
	cfg := filepath.Join(t.TempDir(), "sp.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"192.0.2.1:9\"\n  max_connection_age: 300ms\n"+rlsEdgeDomain), 0o644)
	_, out := socks.start(t, bin, "-config", cfg)
	waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening"`))
	conn, err := grpc.NewClient(socks.addr("envoy_rls"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client, "edge", "user", "ann"); got != 100 {
		t.Fatalf("limit %d, want 100", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for s := conn.GetState(); s == connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("still READY 10 s after a call: no GOAWAY at max_connection_age 300ms\n%s", out)
		}
	}
	if got := rlsLimit(t, client, "edge", "user", "ann"); got != 100 {
		t.Errorf("after the GOAWAY: limit %d, want 100", got)
	}
}
