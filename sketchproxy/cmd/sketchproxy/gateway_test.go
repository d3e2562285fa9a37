package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// needTool finds a server the gateway examples run, or skips the test
// (fails it in CI, where .ci/run installs it).
func needTool(t *testing.T, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err == nil {
		return
	}
	if _, err := os.Stat("/usr/sbin/" + name); err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("no %s in CI (.ci/run installs Debian's %s)", name, pkg)
	}
	t.Skipf("no %s (Debian: %s): the example did not run", name, pkg)
}

// TestGatewayExamples runs sketchproxy/examples/{nginx,caddy}/run.sh as a
// user would, drives a burst through the real server, and interrupts it.
func TestGatewayExamples(t *testing.T) {
	for _, gw := range []struct{ name, pkg string }{{"nginx", "nginx"}, {"caddy", "caddy"}} {
		t.Run(gw.name, func(t *testing.T) {
			needTool(t, gw.name, gw.pkg)
			tmp := t.TempDir()
			// The example's own config, with a rule for the hostile
			// requests below: 2 per 10 s per client on host 127.0.0.1's /api/.
			example, err := os.ReadFile(filepath.Join("..", "..", "examples", gw.name, "sketchproxy.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			cfgDir := t.TempDir()
			cfg := filepath.Join(cfgDir, "sketchproxy.yaml")
			os.WriteFile(cfg, append(example, "  - name: api\n    match: {host: 127.0.0.1, path_prefix: /api/}\n    limits: [{requests: 2, per: 10s}]\n"...), 0o644)
			cmd := exec.Command("bash", filepath.Join("..", "..", "examples", gw.name, "run.sh"))
			cmd.Env = append(os.Environ(), "TMPDIR="+tmp, "SKETCHPROXY_CONFIG="+cfg)
			out := new(lockedBuffer)
			cmd.Stdout, cmd.Stderr = out, out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var url string
			re := regexp.MustCompile(`(?m)^open (http://127\.0\.0\.1:\d+/)$`)
			for deadline := time.Now().Add(2 * time.Minute); url == ""; {
				if m := re.FindStringSubmatch(out.String()); m != nil {
					url = m[1]
					break
				}
				select {
				case err := <-done:
					t.Fatalf("run.sh stopped (%v) before printing its open line:\n%s", err, out)
				case <-time.After(50 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("run.sh printed no open line:\n%s", out)
				}
			}
			if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 1 {
				t.Errorf("run.sh printed more than the open line:\n%s", out)
			}

			getAt := func(path, client string, hdr ...string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest("GET", url, nil)
				req.URL.Opaque = "//" + req.URL.Host + path // as written: %2F stays encoded
				req.Header.Set("X-Forwarded-For", client)   // the demo trusts loopback as its load balancer
				for i := 0; i+1 < len(hdr); i += 2 {
					req.Header.Set(hdr[i], hdr[i+1])
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp
			}
			get := func(client string) *http.Response { return getAt("/", client) }
			var last *http.Response
			got := withinTick(5*time.Second, func(try int) string {
				var codes []string
				for range 7 {
					last = get(fmt.Sprintf("203.0.113.%d", 10+100*try))
					codes = append(codes, strconv.Itoa(last.StatusCode))
				}
				return strings.Join(codes, " ")
			})
			if got != "200 200 200 200 200 429 429" {
				t.Fatalf("a burst of 7 from one client: %s", got)
			}
			ra, err := strconv.Atoi(last.Header.Get("Retry-After"))
			if err != nil || ra < 1 || ra > 10 {
				t.Errorf("Retry-After %q", last.Header.Get("Retry-After"))
			}
			if rl := last.Header.Get("RateLimit"); !strings.Contains(rl, ";r=0;t=") || last.Header.Get("RateLimit-Policy") == "" {
				t.Errorf("refusal's RateLimit %q, RateLimit-Policy %q", rl, last.Header.Get("RateLimit-Policy"))
			}
			other := get("203.0.113.11")
			if other.StatusCode != 200 || !strings.Contains(other.Header.Get("RateLimit"), ";r=4;") {
				t.Errorf("another client: %d, RateLimit %q", other.StatusCode, other.Header.Get("RateLimit"))
			}

			// Hostile requests, each from a client of its own: a query
			// string, a client's own forwarding headers, an encoded slash.
			if got := getAt("/search?q=hello", "203.0.113.20").StatusCode; got != 200 {
				t.Errorf("/search?q=hello under the limit: %d, want 200", got)
			}
			for i, hdr := range [][]string{
				nil,
				{"X-Forwarded-Host", "other.example"},
				{"X-Forwarded-Uri", "/elsewhere", "X-Forwarded-Method", "POST", "X-Original-Uri", "/elsewhere", "X-Original-Host", "other.example"},
			} {
				got := withinTick(5*time.Second, func(try int) string {
					var codes []string
					for range 3 {
						codes = append(codes, strconv.Itoa(getAt("/api/items?x", fmt.Sprintf("203.0.%d.%d", 114+try, 21+i), hdr...).StatusCode))
					}
					return strings.Join(codes, " ")
				})
				if got != "200 200 429" {
					t.Errorf("/api/items?x three times at 2 per 10 s, with %q: %s, want 200 200 429", hdr, got)
				}
			}
			if got := getAt("/a%2Fb", "203.0.113.24").StatusCode; got != 400 {
				t.Errorf("/a%%2Fb: %d, want 400", got)
			}

			// Interrupted, it stops everything it started and leaves nothing.
			syscall.Kill(cmd.Process.Pid, syscall.SIGINT)
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("run.sh did not stop on SIGINT:\n%s", out)
			}
			if c, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"), time.Second); err == nil {
				c.Close()
				t.Errorf("%s still answers after run.sh stopped", url)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("run.sh left %d entries in its TMPDIR: %v", len(left), left)
			}
			if err := exec.Command("pgrep", "-g", fmt.Sprint(cmd.Process.Pid)).Run(); err == nil {
				t.Errorf("processes of run.sh's group are still running")
			}
		})
	}
}

// withinTick runs burst until one run starts and ends in the same tick
// (counts halve at tick edges, and a busy machine can stretch a burst over
// one), at most 3 times, and returns that run's result. Each try must use
// keys of its own. It never waits: a try that crossed an edge is followed
// by one that starts a tick.
func withinTick(tick time.Duration, burst func(try int) string) string {
	for try := 0; ; try++ {
		start := time.Now()
		got := burst(try)
		if start.UnixNano()/int64(tick) == time.Now().UnixNano()/int64(tick) || try == 2 {
			return got
		}
	}
}

// forward_auth on its own listener, beside a proxy on the main one: the
// check answers only at its path, and only its trusted caller.
func TestBinaryForwardAuthListener(t *testing.T) {
	bin := build(t)
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up\n") })}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(uln)
	defer up.Close()
	cfg := filepath.Join(t.TempDir(), "fa.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: "off"
upstream: "http://%s"
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {listen: "127.0.0.1:0", path: /auth}
rules:
  - name: r
    limits: [{requests: 2, per: 1m}]
`, uln.Addr())), 0o644)
	_, out := start(t, bin, "-config", cfg)
	main := "http://" + waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1]
	check := waitFor(t, out, regexp.MustCompile(`msg="forward_auth listening" addr=(\S+) check=(\S+)`))[2]
	awayFromTickEdge(30*time.Second, 10*time.Second) // six requests
	ask := func(client string) int {
		req, _ := http.NewRequest("GET", check, nil)
		req.Header.Set("X-Forwarded-Method", "GET")
		req.Header.Set("X-Forwarded-Uri", "/x")
		req.Header.Set("X-Forwarded-For", client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := []int{ask("192.0.2.1"), ask("192.0.2.1"), ask("192.0.2.1"), ask("192.0.2.2")}; fmt.Sprint(got) != "[200 200 429 200]" {
		t.Errorf("checks: %v, want [200 200 429 200]", got)
	}
	if got := codes(t, main+"/", 1); got != "200" {
		t.Errorf("the proxy on the main listener: %s", got)
	}
	if got := codes(t, strings.TrimSuffix(check, "/auth")+"/other", 1); got != "404" {
		t.Errorf("another path on the check listener: %s", got)
	}
}
