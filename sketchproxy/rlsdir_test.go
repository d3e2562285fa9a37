package sketchproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// configMap lays dir out as the kubelet mounts a ConfigMap: each file a
// symlink NAME -> ..data/NAME, and ..data a symlink to a timestamped
// directory of the files. Each call is one update: the new version's
// directory is written, then ..data is swapped to it in one rename, then
// the top-level links are made for new names and removed for gone ones
// (the order the kubelet's atomic writer uses).
type configMap struct {
	t       *testing.T
	dir     string
	version int
	names   map[string]bool
}

func (cm *configMap) update(files map[string]string) {
	t := cm.t
	cm.version++
	ts := fmt.Sprintf("..2026_01_0%d_00_00_00.000000%d", cm.version, cm.version)
	if err := os.Mkdir(filepath.Join(cm.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(cm.dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(cm.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(cm.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if !cm.names[name] {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(cm.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name := range cm.names {
		if _, ok := files[name]; !ok {
			os.Remove(filepath.Join(cm.dir, name))
		}
	}
	cm.names = map[string]bool{}
	for name := range files {
		cm.names[name] = true
	}
}

// rlsLimitOf asks the service once for domain's descriptor key=value and
// returns the limit it matched (0: none) and the answer.
func rlsLimitOf(t *testing.T, mw *Middleware, domain, key, value string) (uint32, rlsv3.RateLimitResponse_Code) {
	t.Helper()
	resp, err := mw.rlsService().ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), resp.GetOverallCode()
}

// A ConfigMap mounted as envoy_rls.directory loads whole; a swap of its
// ..data link changes the digest, and a reload applies it; a broken
// version is refused with its file and line and the running domains stay;
// dot names (the ConfigMap's ..data and ..TIMESTAMP among them) and
// dangling links are not read.
func TestRLSDirectoryConfigMapSwap(t *testing.T) {
	root := t.TempDir()
	cm := &configMap{t: t, dir: filepath.Join(root, "ratelimit")}
	os.Mkdir(cm.dir, 0o755)
	cm.update(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
	})
	// Not configuration: none of these is read (each would fail to load).
	os.WriteFile(filepath.Join(cm.dir, ".swap.yaml"), []byte("nonsense: ["), 0o644)
	os.Mkdir(filepath.Join(cm.dir, "sub.yaml"), 0o755) // an empty directory
	os.Symlink("..data/gone.yaml", filepath.Join(cm.dir, "gone.yaml"))

	main := filepath.Join(root, "main.yaml")
	os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  directory: ratelimit\n"), 0o644)
	cfg, err := LoadConfig(main)
	if err != nil {
		t.Fatal(err)
	}
	if d, n, l := cfg.EnvoyRLS.Loaded(); d != 1 || n != 1 || l != 1 {
		t.Errorf("Loaded: %d domains, %d descriptors, %d limits; want 1, 1, 1", d, n, l)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Clock: epochsketch.NewManualClock(rlsT0), Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	running := cfg
	digest := func() string {
		t.Helper()
		d, err := running.RLSDirectoryDigest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	reload := func() error {
		return mw.ReloadFrom(func() (*Config, error) {
			c, err := LoadConfig(main)
			if err == nil {
				running = c
			}
			return c, err
		})
	}
	if digest() != cfg.EnvoyRLS.LoadedDirectoryDigest() || digest() == "" {
		t.Fatalf("unchanged directory: digest %q, loaded %q", digest(), cfg.EnvoyRLS.LoadedDirectoryDigest())
	}
	for i := range 3 {
		if _, code := rlsLimitOf(t, mw, "edge", "user", "ann"); code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d of 3 a minute: %v", i+1, code)
		}
	}
	if _, code := rlsLimitOf(t, mw, "edge", "user", "ann"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the 4th call of 3 a minute: %v", code)
	}

	// A new version: edge's limit raised, a new domain in a new file.
	before := digest()
	cm.update(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 50}\n",
		"api.yml":   "domain: api\ndescriptors:\n  - key: key\n    rate_limit: {unit: second, requests_per_unit: 7}\n",
	})
	if digest() == before {
		t.Fatal("the digest did not change with the swap")
	}
	if err := reload(); err != nil {
		t.Fatal(err)
	}
	if running.EnvoyRLS.LoadedDirectoryDigest() != digest() {
		t.Error("after the reload, what was loaded is not what the directory holds")
	}
	if l, _ := rlsLimitOf(t, mw, "edge", "user", "bob"); l != 50 {
		t.Errorf("edge after the swap: limit %d, want 50", l)
	}
	if l, _ := rlsLimitOf(t, mw, "api", "key", "k"); l != 7 {
		t.Errorf("api after the swap: limit %d, want 7", l)
	}

	// A broken version: the reload fails with the file and line, and both
	// domains keep their running limits.
	cm.update(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
		"api.yml":   "domain: api\ndescriptors:\n  - key: key\n    rate_limt: {unit: second, requests_per_unit: 9}\n",
	})
	err = reload()
	if err == nil || !strings.Contains(err.Error(), filepath.Join(cm.dir, "api.yml")+":4:") || !strings.Contains(err.Error(), `unknown field "rate_limt"`) {
		t.Errorf("a broken file: %v, want its path, line 4 and the field", err)
	}
	if l, _ := rlsLimitOf(t, mw, "edge", "user", "cy"); l != 50 {
		t.Errorf("edge after a broken version: limit %d, want the running 50", l)
	}

	// A file removed: its domain goes; unknown domains are OK.
	cm.update(map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
	})
	if err := reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(cm.dir, "api.yml")); err == nil {
		t.Fatal("the update left api.yml's link")
	}
	if l, code := rlsLimitOf(t, mw, "api", "key", "k"); l != 0 || code != rlsv3.RateLimitResponse_OK {
		t.Errorf("api after its file left: limit %d, %v; want no limit, OK", l, code)
	}
	if l, _ := rlsLimitOf(t, mw, "edge", "user", "cy"); l != 5 {
		t.Errorf("edge: limit %d, want 5", l)
	}
}

// Errors of envoy_rls.directory and watch_every name the field and what to
// do; an empty directory loads (domains may come later); a descriptor's
// metadata loads with a warning naming its file and line.
func TestRLSDirectoryErrorsAndWarnings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	write("file.yaml", "domain: a\ndescriptors: [{key: k}]\n")
	os.Mkdir(filepath.Join(dir, "empty"), 0o755)
	for _, c := range []struct{ yaml, want string }{
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  directory: nowhere\n", "main.yaml:3: envoy_rls.directory: " + filepath.Join(dir, "nowhere") + ": no such directory: create it"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  directory: file.yaml\n", "is a file, not a directory: name it in envoy_rls.files"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n  directory: empty\n  watch_every: 1ms\n", "main.yaml:4: envoy_rls.watch_every: 1ms: want 10ms to 1h0m0s"},
		{"envoy_rls:\n  listen: 127.0.0.1:0\n", "no domains: give domains, files or directory"},
	} {
		_, err := LoadConfig(write("main.yaml", c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q:\n got %v\nwant %q", c.yaml, err, c.want)
		}
	}
	cfg, err := LoadConfig(write("main.yaml", "envoy_rls:\n  listen: 127.0.0.1:0\n  directory: empty\n"))
	if err != nil {
		t.Fatalf("an empty directory: %v", err)
	}
	if d, _, _ := cfg.EnvoyRLS.Loaded(); d != 0 || time.Duration(cfg.EnvoyRLS.WatchEvery) != time.Second {
		t.Errorf("an empty directory: %d domains, watch_every %v; want 0, 1s", d, time.Duration(cfg.EnvoyRLS.WatchEvery))
	}

	// metadata, in a file of the directory and inline: loaded, warned
	// about, and the limit applies.
	write("rl/meta.yaml", "domain: m\ndescriptors:\n  - key: k\n    metadata:\n      team: edge\n      tier: [1, 2]\n    rate_limit: {unit: second, requests_per_unit: 4}\n")
	cfg, err = LoadConfig(write("main.yaml", "envoy_rls:\n  listen: 127.0.0.1:0\n  directory: rl\n  domains:\n    - domain: inline\n      descriptors:\n        - key: k\n          metadata: {a: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ws := cfg.EnvoyRLS.Warnings()
	if len(ws) != 2 || !strings.HasPrefix(ws[0], filepath.Join(dir, "main.yaml")+":8: envoy_rls.domains[0].descriptors[0].metadata: ignored") ||
		!strings.HasPrefix(ws[1], filepath.Join(dir, "rl", "meta.yaml")+":4: descriptors[0].metadata: ignored") {
		t.Errorf("warnings:\n%s", strings.Join(ws, "\n"))
	}
	b, err := config.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := b.RLS().Domain("m").Child("k", "v"); n == nil || n.Requests() != 4 {
		t.Errorf("the descriptor with metadata: %+v", n)
	}
}

// envoy_rls.directory loads what envoyproxy/ratelimit's runtime loader
// loads: every file, whatever its extension, in subdirectories too (their
// goruntime walks the tree), in path order; dot names are skipped, files
// and directories (their RUNTIME_IGNOREDOTFILES=true), and so are links to
// directories (filepath.Walk does not follow them). A file of another
// extension that is not a configuration fails the load, as it does there.
func TestRLSDirectoryLoadsAsTheirs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		p := filepath.Join(dir, "rl", name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	domain := func(name string, n int) string {
		return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", name, n)
	}
	write("a.yaml", domain("a", 1))
	write("b.conf", domain("b", 2))      // any extension
	write("team/c.yml", domain("c", 3))  // a subdirectory
	write("team/deep/d", domain("d", 4)) // deeper, no extension
	write(".hidden/e.yaml", "nonsense: [")
	write("team/.f.yaml.swp", "nonsense: [")
	os.Mkdir(filepath.Join(dir, "elsewhere"), 0o755)
	os.WriteFile(filepath.Join(dir, "elsewhere", "g.yaml"), []byte(domain("g", 5)), 0o644)
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(dir, "rl", "linked"))
	os.Symlink(filepath.Join(dir, "elsewhere", "g.yaml"), filepath.Join(dir, "rl", "g-link.yaml"))
	main := filepath.Join(dir, "main.yaml")
	os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  directory: rl\n"), 0o644)
	cfg, err := LoadConfig(main)
	if err != nil {
		t.Fatal(err)
	}
	if d, _, _ := cfg.EnvoyRLS.Loaded(); d != 5 {
		t.Errorf("%d domains loaded, want 5: a, b.conf, team/c.yml, team/deep/d and the link to a file", d)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Clock: epochsketch.NewManualClock(rlsT0), Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	for name, want := range map[string]uint32{"a": 1, "b": 2, "c": 3, "d": 4, "g": 5} {
		if l, _ := rlsLimitOf(t, mw, name, "k", "v"); l != want {
			t.Errorf("domain %s: limit %d, want %d", name, l, want)
		}
	}
	// Moving a file into a subdirectory changes the digest: a reload is due.
	before, _ := cfg.RLSDirectoryDigest()
	os.Rename(filepath.Join(dir, "rl", "b.conf"), filepath.Join(dir, "rl", "team", "b.conf"))
	if after, _ := cfg.RLSDirectoryDigest(); after == before {
		t.Error("a file moved to a subdirectory left the digest as it was")
	}
	// A file that is not a configuration fails the load, with its name.
	write("README.txt", "Rate limits of the team.\n")
	if _, err := LoadConfig(main); err == nil || !strings.Contains(err.Error(), "README.txt") {
		t.Errorf("a README in the directory: %v, want an error naming it", err)
	}
}
