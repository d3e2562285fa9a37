package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// swapConfigMap writes files as a new version of a ConfigMap mounted at
// dir, as the kubelet does: a new timestamped directory, the ..data link
// swapped to it in one rename, then a top-level link NAME -> ..data/NAME
// for each new name and none for a name gone.
func swapConfigMap(t *testing.T, dir string, version int, files map[string]string) {
	t.Helper()
	ts := fmt.Sprintf("..2026_02_%02d_12_00_00.%09d", version, version)
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if name := e.Name(); !strings.HasPrefix(name, ".") && files[name] == "" {
			os.Remove(filepath.Join(dir, name))
		}
	}
	for name := range files {
		os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)) // an existing link stays
	}
}

// waitCount waits until re matches at least n times in out, and returns
// the nth match.
func waitCount(t *testing.T, out *lockedBuffer, re *regexp.Regexp, n int) []string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindAllStringSubmatch(out.String(), -1); len(m) >= n {
			return m[n-1]
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("fewer than %d of %v in:\n%s", n, re, out.String())
	return nil
}

// rlsLimit asks domain's key=value once and returns the limit matched.
func rlsLimit(t *testing.T, client rlsv3.RateLimitServiceClient, domain, key, value string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{desc(key, value)}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// limitBecomes asks, until it answers want or 15 s pass, for the limit of
// domain's descriptor user=ann, key=k: the reloads that follow a swap are
// readiness signals only the service itself can give.
func limitBecomes(t *testing.T, client rlsv3.RateLimitServiceClient, domain string, want uint32) {
	t.Helper()
	key := map[string]string{"edge": "user", "api": "key"}[domain]
	var got uint32
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = rlsLimit(t, client, domain, key, "k"); got == want {
			return
		}
	}
	t.Fatalf("%s's limit stayed %d, want %d", domain, got, want)
}

// envoy_rls.directory reloads by itself: a ConfigMap swap is live without
// a signal, a broken version is logged once with its file and line while
// the running domains stay, and the next good version applies.
func TestBinaryEnvoyRLSDirectory(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	rl := filepath.Join(dir, "ratelimit")
	edge := func(n int) string {
		return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
	}
	swapConfigMap(t, rl, 1, map[string]string{"edge.yaml": edge(100)})
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  directory: ratelimit\n  watch_every: 20ms\n"), 0o644)
	_, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client, "edge", "user", "ann"); got != 100 {
		t.Fatalf("limit %d, want 100", got)
	}

	// A new version: edge's limit changed, and a new file whose metadata
	// is ignored with a warning.
	swapConfigMap(t, rl, 2, map[string]string{
		"edge.yaml": edge(7),
		"api.yaml":  "domain: api\ndescriptors:\n  - key: key\n    metadata: {owner: team-a}\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
	})
	// The kubelet's update is two steps (the ..data swap, then the new
	// link): wait until both are live.
	limitBecomes(t, client, "edge", 7)
	limitBecomes(t, client, "api", 9)
	if !regexp.MustCompile(`level=WARN msg="config: \S*api.yaml:4: descriptors\[0\]\.metadata: ignored`).MatchString(out.String()) {
		t.Errorf("no warning about api.yaml's metadata:\n%s", out)
	}

	// A broken version: logged with the file and line, the running
	// domains stay.
	swapConfigMap(t, rl, 3, map[string]string{"edge.yaml": edge(7), "api.yaml": "domain: api\ndescriptors:\n  - key: key\n    rate_limt: {}\n"})
	m := waitFor(t, out, regexp.MustCompile(`msg="reload failed: keeping the running config" err="([^"]*)"`))
	if !strings.Contains(m[1], filepath.Join(rl, "api.yaml")+":4:") {
		t.Errorf("the error %q does not name api.yaml:4", m[1])
	}
	if got := rlsLimit(t, client, "api", "key", "k"); got != 9 {
		t.Errorf("after a broken version: api's limit %d, want the running 9", got)
	}

	// Fixed: applied; the broken version was reported once, not at every
	// look in between.
	swapConfigMap(t, rl, 4, map[string]string{"edge.yaml": edge(3)})
	limitBecomes(t, client, "edge", 3)
	limitBecomes(t, client, "api", 0)
	if n := strings.Count(out.String(), "reload failed"); n != 1 {
		t.Errorf("the broken version was reported %d times, want once:\n%s", n, out)
	}
}
