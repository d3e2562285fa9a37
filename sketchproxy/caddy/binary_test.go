package caddyepochsketch

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests below run a real Caddy binary, built from cmd/caddy as xcaddy
// would build it, with real HTTP requests on loopback.

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// caddyBinary builds cmd/caddy once per test run (the first build of
// Caddy's modules takes minutes; later ones, the link).
func caddyBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "epochsketch-caddy-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "caddy")
		out, err := exec.Command("go", "build", "-o", binPath, "./cmd/caddy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/caddy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// caddyServer is a running Caddy: its site and admin ports, its process.
type caddyServer struct {
	t            testing.TB
	site         string // the Caddyfile's site block, a template
	dir          string
	port, admin  int
	cmd          *exec.Cmd
	log          lockedBuffer // its output
	upstreamAddr string
}

// freePort returns a loopback port nothing listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// globalOptions start every test's Caddyfile: the admin API on its own
// free port, everything Caddy writes in the test's directory.
const globalOptions = `{
	admin 127.0.0.1:{{ADMIN}}
	auto_https off
	persist_config off
	storage file_system {{DIR}}/storage
}

`

// testSite is the site the tests drive: the app behind a per-address
// zone, and /flood/ answering from Caddy itself behind a zone keyed by
// X-API-Key. gen shows in X-Gen, to tell a reload happened.
const testSite = `http://127.0.0.1:{{PORT}} {
	header X-Gen {{GEN}}
	@flood path /flood/*
	handle @flood {
		epochsketch {
			zone flood_keys {
				key {http.request.header.X-API-Key}
				events 100
				window 1m
			}
		}
		respond "flood ok"
	}
	handle {
		epochsketch {
			zone per_ip {
				key {remote_host}
				events 5
				window 10m
			}
		}
		reverse_proxy {{UPSTREAM}}
	}
}
`

func (s *caddyServer) caddyfile(gen int) []byte {
	r := strings.NewReplacer("{{ADMIN}}", strconv.Itoa(s.admin), "{{PORT}}", strconv.Itoa(s.port),
		"{{DIR}}", s.dir, "{{GEN}}", strconv.Itoa(gen), "{{UPSTREAM}}", s.upstreamAddr)
	return []byte(r.Replace(globalOptions + s.site))
}

// startCaddy starts the binary with site (a template: {{PORT}},
// {{UPSTREAM}}, {{GEN}}) on free ports in front of upstream and waits
// until its site answers; a port taken between the choice and the bind
// gets a new try.
func startCaddy(t testing.TB, site, upstream string) *caddyServer {
	bin := caddyBinary(t)
	for try := 0; try < 5; try++ {
		s := &caddyServer{t: t, site: site, dir: t.TempDir(), upstreamAddr: upstream}
		s.port, s.admin = freePort(t), freePort(t)
		if s.port == s.admin {
			continue
		}
		conf := filepath.Join(s.dir, "Caddyfile")
		if err := os.WriteFile(conf, s.caddyfile(1), 0o600); err != nil {
			t.Fatal(err)
		}
		s.cmd = exec.Command(bin, "run", "--config", conf, "--adapter", "caddyfile")
		s.cmd.Env = append(os.Environ(), "HOME="+s.dir, "XDG_DATA_HOME="+s.dir, "XDG_CONFIG_HOME="+s.dir)
		s.cmd.Stdout, s.cmd.Stderr = &s.log, &s.log
		if err := s.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { s.cmd.Wait(); close(exited) }()
		if s.ready(exited) {
			t.Cleanup(func() {
				s.cmd.Process.Signal(os.Interrupt)
				select {
				case <-exited:
				case <-time.After(10 * time.Second):
					s.cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("caddy's log:\n%s", s.log.String())
				}
			})
			return s
		}
		s.cmd.Process.Kill()
		<-exited
		t.Logf("caddy did not start (try %d):\n%s", try+1, s.log.String())
	}
	t.Fatal("caddy did not start in 5 tries")
	return nil
}

// ready waits for Caddy's site to answer, or for it to exit.
func (s *caddyServer) ready(exited chan struct{}) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(s.port), time.Second); err == nil {
			c.Close()
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// url is the site's URL for path.
func (s *caddyServer) url(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(s.port) + path
}

// reload loads the Caddyfile of generation gen through the admin API; it
// returns when the new config runs.
func (s *caddyServer) reload(gen int) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(s.admin)+"/load", bytes.NewReader(s.caddyfile(gen)))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("reload: %s: %s", resp.Status, body)
	}
}

// metric returns the value of a metric line that starts with prefix on
// Caddy's admin /metrics, or -1.
func (s *caddyServer) metric(prefix string) float64 {
	s.t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(s.admin) + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				s.t.Fatalf("metric %s: %v", prefix, err)
			}
			return f
		}
	}
	return -1
}

// rss is Caddy's resident set size, from /proc.
func (s *caddyServer) rss() int64 {
	s.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		s.t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				s.t.Fatal(err)
			}
			return kb << 10
		}
	}
	s.t.Fatal("no VmRSS in /proc status")
	return 0
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip: to Caddy, a client of its own ({remote_host}).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
}

type answer struct {
	code                                 int
	retryAfter, rateLimit, policy, gen   string
	body, upstreamQuery, upstreamKeySeen string
}

func get(t *testing.T, c *http.Client, url string, header ...string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return answer{
		code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		rateLimit: resp.Header.Get("RateLimit"), policy: resp.Header.Get("RateLimit-Policy"),
		gen: resp.Header.Get("X-Gen"), body: string(body),
		upstreamQuery: resp.Header.Get("X-Seen-Query"), upstreamKeySeen: resp.Header.Get("X-Seen-Key-Headers"),
	}
}

// app is the upstream: it says which query it got and whether any
// internal key header reached it.
func app(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var seen []string
		for name := range r.Header {
			if strings.HasPrefix(strings.ToLower(name), "epochsketch") {
				seen = append(seen, name)
			}
		}
		w.Header().Set("X-Seen-Query", r.URL.RawQuery)
		w.Header().Set("X-Seen-Key-Headers", strings.Join(seen, ","))
		io.WriteString(w, "app ok\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestCaddyBinary drives the built Caddy: a burst from one address, another
// address unaffected, query strings, a client's attempt to choose its key,
// a reload that keeps the counts, and the metrics.
func TestCaddyBinary(t *testing.T) {
	s := startCaddy(t, testSite, app(t))
	a, b := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	// per_ip's counts halve every 5 minutes (10m with bursts of 5: the
	// tick is half the window, sketchproxy/internal/engine/limitmath.go): the checks below
	// start at least 20 s before a halving (they take about 8) and fail
	// if they outlast it.
	const tick = 5 * time.Minute
	end := awayFromTickEdge(tick, 20*time.Second)
	defer func() {
		if time.Now().After(end) {
			t.Errorf("the checks took past a halving of the counts (%v): too slow to be judged", end)
		}
	}()

	// A burst: five through to the app, then 429 with Retry-After and the
	// RateLimit fields. Query strings change nothing about the key, and
	// reach the app as sent; the client's own key header is ignored.
	var codes []int
	for i := 0; i < 7; i++ {
		ans := get(t, a, s.url(fmt.Sprintf("/page?q=%d&x=y", i)), "Epochsketch-Zone-0", fmt.Sprintf("spoof%d", i))
		codes = append(codes, ans.code)
		if i < 5 {
			if ans.code != 200 || ans.body != "app ok\n" {
				t.Fatalf("request %d: %d %q, want 200 from the app", i+1, ans.code, ans.body)
			}
			if want := fmt.Sprintf("q=%d&x=y", i); ans.upstreamQuery != want {
				t.Errorf("the app got the query %q, want %q", ans.upstreamQuery, want)
			}
			if ans.upstreamKeySeen != "" {
				t.Errorf("internal key headers reached the app: %s", ans.upstreamKeySeen)
			}
			if !strings.Contains(ans.rateLimit, `"per_ip-`) || !strings.Contains(ans.policy, ";q=5;w=600") {
				t.Errorf("request %d: RateLimit %q, RateLimit-Policy %q: want the per_ip policy, 5 per 600 s", i+1, ans.rateLimit, ans.policy)
			}
			continue
		}
		if ans.code != http.StatusTooManyRequests {
			t.Fatalf("request %d: %d, want 429 (codes so far %v)", i+1, ans.code, codes)
		}
		if n, err := strconv.Atoi(ans.retryAfter); err != nil || n < 1 || n > 600 {
			t.Errorf("Retry-After %q: want 1 to 600 seconds", ans.retryAfter)
		}
		if !strings.Contains(ans.rateLimit, "r=0") || ans.policy == "" {
			t.Errorf("429 without the RateLimit fields: RateLimit %q, RateLimit-Policy %q", ans.rateLimit, ans.policy)
		}
	}
	t.Logf("one address, 7 requests: %v", codes)

	// Another address: its own count.
	if ans := get(t, b, s.url("/")); ans.code != 200 {
		t.Fatalf("another client: %d, want 200", ans.code)
	}

	// The flood zone keys on X-API-Key: two keys, two counts; no key is
	// the one key "-".
	if ans := get(t, a, s.url("/flood/x"), "X-API-Key", "k1"); ans.code != 200 || ans.body != "flood ok" {
		t.Fatalf("/flood/ with a key: %d %q", ans.code, ans.body)
	}

	// A reload with the same zones (and another X-Gen) keeps the counts:
	// the client at its limit stays refused, the other still has room.
	s.reload(2)
	ans := get(t, a, s.url("/after-reload"))
	if ans.gen != "2" {
		t.Fatalf("X-Gen %q after the reload, want 2", ans.gen)
	}
	if ans.code != http.StatusTooManyRequests {
		t.Fatalf("the client at its limit got %d after a reload, want 429: the counts were lost", ans.code)
	}
	if ans := get(t, b, s.url("/")); ans.code != 200 {
		t.Fatalf("the other client got %d after a reload, want 200", ans.code)
	}

	// Caddy's metrics: decisions by zone and outcome, across the reload.
	if v := s.metric(`caddy_http_epochsketch_decisions_total{outcome="reject",zone="per_ip"}`); v != 3 {
		t.Errorf("per_ip rejections in Caddy's metrics: %v, want 3", v)
	}
	if v := s.metric(`caddy_http_epochsketch_decisions_total{outcome="allow",zone="per_ip"}`); v != 7 {
		t.Errorf("per_ip admissions in Caddy's metrics: %v, want 7", v)
	}
}

// awayFromTickEdge returns at least margin before the next boundary of
// tick (the sketches' ticks are aligned on the Unix clock), waiting for the
// boundary if it is nearer; it returns the next boundary.
func awayFromTickEdge(tick, margin time.Duration) time.Time {
	now := time.Now()
	left := tick - time.Duration(now.UnixNano()%int64(tick))
	if left < margin {
		time.Sleep(left + 10*time.Millisecond)
		return now.Add(left + tick)
	}
	return now.Add(left)
}

// TestCaddyFlood sends distinct X-API-Key values, each once, through the
// built Caddy (keep-alive, a few connections) and checks that Caddy's RSS
// stays flat: the sketches are allocated at start, whatever the number of
// keys. 100,000 keys by default; EPOCHSKETCH_CADDY_FLOOD_N=1000000 for a
// million.
func TestCaddyFlood(t *testing.T) {
	n := 100_000
	if v := os.Getenv("EPOCHSKETCH_CADDY_FLOOD_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 20_000 {
			t.Fatalf("EPOCHSKETCH_CADDY_FLOOD_N=%q: want a whole number, at least 20000", v)
		}
	}
	s := startCaddy(t, testSite, app(t))
	const workers = 4
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	url := s.url("/flood/")
	var next atomic.Int64
	var refused atomic.Int64
	flood := func(upto int64) error {
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
				for {
					i := next.Add(1)
					if i > upto {
						return
					}
					req.Header.Set("X-API-Key", "key-"+strconv.FormatInt(i, 36))
					resp, err := c.Do(req)
					if err != nil {
						errs <- err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						refused.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	// Warm up: Caddy's pools and the connections are in place.
	warm := int64(n / 10)
	if err := flood(warm); err != nil {
		t.Fatal(err)
	}
	before := s.rss()
	start := time.Now()
	if err := flood(int64(n)); err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start)
	after := s.rss()
	sent := int64(n) - warm
	t.Logf("%d distinct keys (after %d to warm up) in %v: %.0f requests/s; Caddy's RSS %.1f MiB before, %.1f MiB after (%+.1f MiB); %d refused",
		sent, warm, elapsed.Round(time.Millisecond), float64(sent)/elapsed.Seconds(),
		float64(before)/(1<<20), float64(after)/(1<<20), float64(after-before)/(1<<20), refused.Load())
	if refused.Load() != 0 {
		t.Errorf("%d of the one-off keys were refused: each key sent once is under its limit", refused.Load())
	}
	// The bound: 16 MiB of the runtime's and Caddy's own slack, or 64
	// bytes a key, whichever is more (55 MiB for the 900,000 keys after a
	// million-key run's warm-up). A limiter that keeps anything per key (a
	// map entry with its key is more than 64 bytes) fails it there.
	bound := max(int64(16<<20), 64*sent)
	if grow := after - before; grow > bound {
		t.Errorf("Caddy's RSS grew by %.1f MiB over %d keys (bound %.1f MiB): the limiter's memory should not grow with keys",
			float64(grow)/(1<<20), sent, float64(bound)/(1<<20))
	}
}
