package caddyepochsketch

import (
	"bufio"
	"bytes"
	"cmp"
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

// attackSite is a site behind three zones of 3 (1 on /api/) an hour, by
// API key, by the client's network past the trusted proxy, and on /api/
// in every spelling an upstream may serve as /api/.
const attackSite = `http://127.0.0.1:{{PORT}} {
	@api epochsketch_path /api/*
	epochsketch @api {
		zone api {
			key {remote_host}
			events 1
			window 1h
		}
	}
	epochsketch {
		zone keys {
			key {header.X-API-Key}
			events 3
			window 1h
			match {
				path /keys/*
			}
		}
		zone nets {
			key {http.epochsketch.client_prefix}
			events 3
			window 1h
			match {
				path /xff/*
			}
		}
	}
	reverse_proxy {{UPSTREAM}}
}
`

// TestCaddyAttacks tries what issue 38 found letting traffic past: a
// doubled key header, a client naming its own address past Caddy's
// non-strict trusted_proxies, path spellings that Tomcat, Jetty and IIS
// serve as /api/x; and checks the request reaches the app as sent, with
// no check that no zone asked for.
func TestCaddyAttacks(t *testing.T) {
	s := startCaddy(t, attackSite, app(t), "\tservers {\n\t\ttrusted_proxies static 127.0.0.1/32\n\t}")
	offTheEdge(t)

	admitted := 0
	c := clientFrom("127.0.1.1")
	for i := range 8 {
		if a := get(t, c, s.url("/keys/x"), "X-API-Key", "alice", "X-API-Key", fmt.Sprintf("junk%d", i)); a.code == 200 {
			admitted++
		} else if a.code != 429 || !strings.Contains(a.rateLimit, `"keys-per-1h";r=0`) {
			t.Fatalf("a doubled key: %d, RateLimit %q", a.code, a.rateLimit)
		}
	}
	if admitted != 3 {
		t.Errorf("X-API-Key alice with a junk second value: %d of 8 admitted, want 3", admitted)
	}
	if a := get(t, c, s.url("/keys/x"), "X_API_Key", "bob", "X-API-Key", "alice"); a.code != 429 {
		t.Errorf("alice beside X_API_Key bob: %d, want 429 (Caddy drops the '_' spelling)", a.code)
	}

	admitted = 0
	proxy := clientFrom("127.0.0.1") // the trusted proxy, passing on whatever clients wrote
	for i := range 8 {
		if a := get(t, proxy, s.url("/xff/x"), "X-Forwarded-For", fmt.Sprintf("10.0.0.%d, 5.5.5.5", i)); a.code == 200 {
			admitted++
		} else if a.code != 429 || !strings.Contains(a.rateLimit, `"nets-per-1h";r=0`) {
			t.Fatalf("X-Forwarded-For: %d, RateLimit %q", a.code, a.rateLimit)
		}
	}
	if admitted != 3 {
		t.Errorf("5.5.5.5 naming itself 10.0.0.$i: %d of 8 admitted, want 3 (its prefix is the right-most untrusted address)", admitted)
	}
	// Behind a second trusted proxy (127.0.0.1 again), each client is its
	// own: trusted hops are skipped, not taken for the client.
	admitted = 0
	for i := range 8 {
		if get(t, proxy, s.url("/xff/x"), "X-Forwarded-For", fmt.Sprintf("6.6.6.%d, 127.0.0.1", i)).code == 200 {
			admitted++
		}
	}
	if admitted != 8 {
		t.Errorf("8 clients behind two trusted proxies: %d admitted, want 8 (each its own count)", admitted)
	}

	c = clientFrom("127.0.1.2")
	for i, p := range []string{"/api/x", "/api;a=1/x", "/api./x", "/API/x", "/api::$DATA/x", "/x/..;/api/x"} {
		a := get(t, c, s.url(p))
		want := 429
		if i == 0 {
			want = 200
		}
		if a.code != want {
			t.Errorf("%s after /api/x at 1 an hour: %d, want %d", p, a.code, want)
		}
	}

	c = clientFrom("127.0.1.3")
	for _, tc := range []struct{ method, target string }{
		{"GET", "/ip//a/./b/../c?q=1&q=2"},
		{"GET", "/a%2Fb"},
		{"get", "/lower"},
		{"TRACE", "/trace"},
	} {
		a := send(t, c, tc.method, s.url(tc.target))
		if a.code != 200 || a.seenURI != tc.target || a.seenMethod != tc.method {
			t.Errorf("%s %s reached the app as %s %s (%d), want it as sent", tc.method, tc.target, a.seenMethod, a.seenURI, a.code)
		}
	}
}

// reloadSite has an identical zone in two sites, and another zone beside
// it in one, whose window {{GEN}} changes; the second generation also has
// a site more, before them, and other lines.
const reloadSite = `http://a.test:{{PORT}} {
	header X-Gen {{GEN}}
	epochsketch {
		zone per_ip {
			key {remote_host}
			events 3
			window 1h
		}
		zone other {
			key {remote_host}
			events 10
			window {{GEN}}h
		}
	}
	respond "a"
}
http://b.test:{{PORT}} {
	header X-Gen {{GEN}}
	` + zone3 + `
	respond "b"
}
`

// TestCaddyReload reloads through the admin API: the zones whose
// definition did not change keep their counts, each in its own site; the
// one that changed starts again; the metrics count across the reload.
func TestCaddyReload(t *testing.T) {
	s := startCaddy(t, reloadSite, "")
	offTheEdge(t)
	port := strconv.Itoa(s.port)
	c, d := clientFrom("127.0.2.1"), clientFrom("127.0.2.2")
	if codes, _ := burst(t, c, 4, s.url("/"), "Host", "a.test:"+port); codes != "200 200 200 429" {
		t.Fatalf("a.test: %s", codes)
	}
	if codes, _ := burst(t, c, 2, s.url("/"), "Host", "b.test:"+port); codes != "200 200" {
		t.Fatalf("b.test, the same zone in another site: %s, want its own count", codes)
	}
	if codes, _ := burst(t, d, 2, s.url("/"), "Host", "a.test:"+port); codes != "200 200" {
		t.Fatalf("another client on a.test: %s", codes)
	}
	s.reload("# a comment, and a site before the others\nhttp://c.test:{{PORT}} {\n\t"+zone3+"\n\trespond \"c\"\n}\n"+reloadSite, 2)
	a := get(t, c, s.url("/"), "Host", "a.test:"+port)
	if a.gen != "2" {
		t.Fatalf("X-Gen %q after the reload, want 2", a.gen)
	}
	if a.code != 429 || !strings.Contains(a.rateLimit, `"per_ip-per-1h";r=0`) {
		t.Errorf("a.test after the reload: %d, RateLimit %q; want 429 by per_ip, whose counts were kept", a.code, a.rateLimit)
	}
	// d's third request: per_ip kept its 2 (r=0 now); other, whose window
	// changed, counts from 0 (r=9 of 10, not 7).
	if a := get(t, d, s.url("/"), "Host", "a.test:"+port); a.code != 200 ||
		!strings.Contains(a.rateLimit, `"per_ip-per-1h";r=0;`) || !strings.Contains(a.rateLimit, `"other-per-2h";r=9;`) {
		t.Errorf("the other client on a.test after the reload: %d, RateLimit %q; want per_ip at r=0 and the changed zone other at r=9", a.code, a.rateLimit)
	}
	if b := get(t, c, s.url("/"), "Host", "b.test:"+port); b.code != 200 || !strings.Contains(b.rateLimit, `"per_ip-per-1h";r=0`) {
		t.Errorf("b.test after the reload: %d, RateLimit %q; want its third request admitted, r=0", b.code, b.rateLimit)
	}
	if a := get(t, c, s.url("/"), "Host", "c.test:"+port); a.code != 200 {
		t.Errorf("c.test, the new site: %d", a.code)
	}
	// per_ip, over the three sites and the reload: admitted 3+2+2 before,
	// 1+1+1 after; refused once before and once after.
	if v := s.metric(`caddy_http_epochsketch_decisions_total{outcome="reject",zone="per_ip"}`); v != 2 {
		t.Errorf("per_ip rejections in Caddy's metrics: %v, want 2", v)
	}
	if v := s.metric(`caddy_http_epochsketch_decisions_total{outcome="allow",zone="per_ip"}`); v != 10 {
		t.Errorf("per_ip admissions in Caddy's metrics: %v, want 10", v)
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

// floodSite answers /flood/ from Caddy itself behind a zone keyed by
// X-API-Key, inside handle, before respond.
const floodSite = `http://127.0.0.1:{{PORT}} {
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
}
`

// TestCaddyFlood sends distinct X-API-Key values, each once, through the
// built Caddy (keep-alive, a few connections) and checks that Caddy's RSS
// stays flat: the sketches are allocated at start, whatever the number of
// keys. First it checks that the limiter runs there: one key sent 101
// times at 100 a minute gets a 429 with the RateLimit field; and every
// answer of the flood carries the field. 100,000 keys by default, 50,000
// under -short; EPOCHSKETCH_CADDY_FLOOD_N=1000000 for a million.
func TestCaddyFlood(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 50_000
	}
	if v := os.Getenv("EPOCHSKETCH_CADDY_FLOOD_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 20_000 {
			t.Fatalf("EPOCHSKETCH_CADDY_FLOOD_N=%q: want a whole number, at least 20000", v)
		}
	}
	s := startCaddy(t, floodSite, "")
	// 100 a minute: counts halve every 30 s; 101 requests take well
	// under the 5 s kept clear of a halving (a fifth of a second here).
	awayFromTickEdge(30*time.Second, 5*time.Second)
	codes, last := burst(t, &http.Client{}, 101, s.url("/flood/"), "X-API-Key", "the-limit-runs")
	if !strings.HasSuffix(codes, " 200 429") || strings.Count(codes, "200") != 100 || !strings.Contains(last.rateLimit, `"flood_keys-per-1m";r=0;t=`) {
		t.Fatalf("one key, 101 requests at 100 a minute: the last two %q, RateLimit %q; want 100 admitted, then 429 with the field",
			codes[len(codes)-7:], last.rateLimit)
	}
	const workers = 4
	tr := &http.Transport{MaxIdleConnsPerHost: workers, MaxConnsPerHost: workers}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	url := s.url("/flood/")
	var next atomic.Int64
	var refused, unjudged atomic.Int64
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
					if !strings.HasPrefix(resp.Header.Get("RateLimit"), `"flood_keys-per-1m";r=`) {
						unjudged.Add(1)
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
	if unjudged.Load() != 0 {
		t.Errorf("%d answers of the flood without the zone's RateLimit field: the limiter did not judge them", unjudged.Load())
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
