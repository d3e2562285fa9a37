package caddyepochsketch

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
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
	"syscall"
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

// caddyServer is a running Caddy: its ports, its process.
type caddyServer struct {
	t            testing.TB
	site         string // the Caddyfile after the global options, a template
	global       string // more global options
	dir          string
	port, port2  int // {{PORT}} and {{PORT2}}
	admin        int
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
{{GLOBAL}}
}

`

func (s *caddyServer) caddyfile(site string, gen int) []byte {
	r := strings.NewReplacer("{{ADMIN}}", strconv.Itoa(s.admin), "{{PORT}}", strconv.Itoa(s.port), "{{PORT2}}", strconv.Itoa(s.port2),
		"{{DIR}}", s.dir, "{{GEN}}", strconv.Itoa(gen), "{{UPSTREAM}}", s.upstreamAddr, "{{GLOBAL}}", s.global)
	return []byte(r.Replace(globalOptions + site))
}

// startCaddy starts the binary with site (a template: {{PORT}}, {{PORT2}},
// {{UPSTREAM}}, {{GEN}}; global adds global options) on free ports in
// front of upstream and waits until it answers; a port taken between the
// choice and the bind gets a new try.
func startCaddy(t testing.TB, site, upstream string, global ...string) *caddyServer {
	bin := caddyBinary(t)
	for try := 0; try < 5; try++ {
		s := &caddyServer{t: t, site: site, global: strings.Join(global, "\n"), dir: t.TempDir(), upstreamAddr: upstream}
		s.port, s.port2, s.admin = freePort(t), freePort(t), freePort(t)
		if s.port == s.admin || s.port2 == s.admin || s.port == s.port2 {
			continue
		}
		conf := filepath.Join(s.dir, "Caddyfile")
		if err := os.WriteFile(conf, s.caddyfile(site, 1), 0o600); err != nil {
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

// ready waits for Caddy's sites to answer (both ports, where the site
// uses two), or for it to exit.
func (s *caddyServer) ready(exited chan struct{}) bool {
	ports := []int{s.port}
	if strings.Contains(s.site, "{{PORT2}}") {
		ports = append(ports, s.port2)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return false
		default:
		}
		up := 0
		for _, p := range ports {
			if c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(p), time.Second); err == nil {
				c.Close()
				up++
			}
		}
		if up == len(ports) {
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

// reload loads site (a template, as startCaddy's) as generation gen
// through the admin API; it returns when the new config runs.
func (s *caddyServer) reload(site string, gen int) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:"+strconv.Itoa(s.admin)+"/load", bytes.NewReader(s.caddyfile(site, gen)))
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
// address ip: to Caddy, a client of its own ({remote_host}). Each request
// has a connection of its own: one kept alive across a reload may be
// closed by the old config as the request is sent (EOF).
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

type answer struct {
	code                               int
	retryAfter, rateLimit, policy, gen string
	body, seenURI, seenMethod          string
}

// get sends method (GET if empty) to url with header pairs (a name may
// repeat; "Host" sets the request's host).
func send(t *testing.T, c *http.Client, method, url string, header ...string) answer {
	t.Helper()
	req, _ := http.NewRequest(cmp.Or(method, http.MethodGet), url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil && errors.Is(err, syscall.ECONNRESET) {
		// A reset is a server that closed the connection with the request
		// unread: Caddy's old server, stopping at a reload as it accepted
		// the connection (once in CI, the request right after a reload).
		// No handler saw it, so it is sent again (no body), once.
		resp, err = c.Do(req)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return answer{
		code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
		rateLimit: resp.Header.Get("RateLimit"), policy: resp.Header.Get("RateLimit-Policy"),
		gen: resp.Header.Get("X-Gen"), body: string(body),
		seenURI: resp.Header.Get("X-Seen-Uri"), seenMethod: resp.Header.Get("X-Seen-Method"),
	}
}

func get(t *testing.T, c *http.Client, url string, header ...string) answer {
	t.Helper()
	return send(t, c, "", url, header...)
}

// app is the upstream: it says which request line it got.
func app(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Seen-Uri", r.RequestURI)
		w.Header().Set("X-Seen-Method", r.Method)
		io.WriteString(w, "app ok\n")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// burst sends n requests and returns their codes and the last answer.
func burst(t *testing.T, c *http.Client, n int, url string, header ...string) (string, answer) {
	t.Helper()
	var codes []string
	var last answer
	for range n {
		last = get(t, c, url, header...)
		codes = append(codes, strconv.Itoa(last.code))
	}
	return strings.Join(codes, " "), last
}

// zone3 is a zone of 3 requests an hour by client address: its counts
// halve every 30 minutes, far from any test's length (awayFromTickEdge
// keeps the tests off the halvings).
const zone3 = `epochsketch {
		zone per_ip {
			key {remote_host}
			events 3
			window 1h
		}
	}`

// placementsSite puts one zone of 3 an hour in every placement issue 38
// lists, one site (host) each; a refusal on {{PORT2}} goes to
// handle_errors.
const placementsSite = `http://top.test:{{PORT}} {
	` + zone3 + `
	respond "top"
}
http://handle.test:{{PORT}} {
	` + zone3 + `
	handle /h/* {
		respond "handle"
	}
	handle_path /p/* {
		respond "handle_path"
	}
	route /r/* {
		respond "route"
	}
}
http://inside.test:{{PORT}} {
	handle {
		` + zone3 + `
		respond "inside"
	}
}
http://route.test:{{PORT}} {
	route {
		` + zone3 + `
		respond "route"
	}
}
http://errors.test:{{PORT2}} {
	` + zone3 + `
	respond "errors"
	handle_errors 429 {
		respond "custom: zone {http.epochsketch.zone}, retry after {http.epochsketch.retry_after} s" 429
	}
}
`

// tick is zone3's tick: its counts halve every 30 minutes.
const tick = 30 * time.Minute

// offTheEdge fails the test if it outlasts the next halving of zone3's
// counts (after waiting for it if it is under 20 s away).
func offTheEdge(t *testing.T) {
	end := awayFromTickEdge(tick, 20*time.Second)
	t.Cleanup(func() {
		if time.Now().After(end) {
			t.Errorf("the checks took past a halving of the counts (%v): too slow to be judged", end)
		}
	})
}

// TestCaddyPlacements builds Caddy with the module and runs a zone
// wherever a user writes it (issue 38): at the top level before respond,
// before handle, handle_path and route, inside handle with respond, inside
// route, and with handle_errors answering the refusal. Each place gets a
// 429 with Retry-After and the RateLimit field after 3 requests, and
// counts apart from the same zone in the other sites.
func TestCaddyPlacements(t *testing.T) {
	s := startCaddy(t, placementsSite, "")
	offTheEdge(t)
	c := clientFrom("127.0.0.2") // one client everywhere: each site counts it apart
	port := strconv.Itoa(s.port)
	for _, tc := range []struct{ host, path, body string }{
		{"top.test", "/", "top"},
		{"handle.test", "/h/x", "handle"},
		{"inside.test", "/", "inside"},
		{"route.test", "/", "route"},
	} {
		codes, last := burst(t, c, 4, s.url(tc.path), "Host", tc.host+":"+port)
		if codes != "200 200 200 429" {
			t.Errorf("%s%s: %s, want 200 200 200 429", tc.host, tc.path, codes)
			continue
		}
		if n, err := strconv.Atoi(last.retryAfter); err != nil || n < 1 || n > 3600 ||
			!strings.Contains(last.rateLimit, `"per_ip-per-1h";r=0;t=`) || !strings.Contains(last.policy, `"per_ip-per-1h";q=3;w=3600`) ||
			!strings.Contains(last.body, `"violated-policies":["per_ip-per-1h"]`) {
			t.Errorf("%s%s: the 429: Retry-After %q, RateLimit %q, RateLimit-Policy %q, body %q", tc.host, tc.path, last.retryAfter, last.rateLimit, last.policy, last.body)
		}
		if a := get(t, clientFrom("127.0.0.3"), s.url(tc.path), "Host", tc.host+":"+port); a.code != 200 || a.body != tc.body ||
			!strings.Contains(a.rateLimit, `"per_ip-per-1h";r=2;t=`) {
			t.Errorf("%s%s from another client: %d %q, RateLimit %q; want 200 %q with r=2", tc.host, tc.path, a.code, a.body, a.rateLimit, tc.body)
		}
	}
	// The top-level zone of handle.test judges handle_path and route
	// blocks too: one count for the site.
	for _, p := range []string{"/p/x", "/r/x"} {
		if a := get(t, c, s.url(p), "Host", "handle.test:"+port); a.code != 429 || !strings.Contains(a.rateLimit, ";r=0;") {
			t.Errorf("handle.test%s after the site's limit: %d, RateLimit %q; want 429", p, a.code, a.rateLimit)
		}
	}
	if codes, _ := burst(t, clientFrom("127.0.0.4"), 4, s.url("/p/x"), "Host", "handle.test:"+port); codes != "200 200 200 429" {
		t.Errorf("handle_path: %s, want 200 200 200 429", codes)
	}
	// handle_errors answers the refusal, with the fields already set.
	errs := "http://127.0.0.1:" + strconv.Itoa(s.port2) + "/"
	codes, last := burst(t, c, 4, errs, "Host", "errors.test:"+strconv.Itoa(s.port2))
	if codes != "200 200 200 429" || last.body != "custom: zone per_ip, retry after "+last.retryAfter+" s" || last.retryAfter == "" ||
		!strings.Contains(last.rateLimit, `"per_ip-per-1h";r=0;t=`) {
		t.Errorf("handle_errors: %s, the 429: %q, Retry-After %q, RateLimit %q", codes, last.body, last.retryAfter, last.rateLimit)
	}
}
