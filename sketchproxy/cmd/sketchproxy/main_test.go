package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

func TestFlags(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"-example"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "rules:") {
		t.Fatalf("-example: %d %q", code, errb.String())
	}
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, out.Bytes(), 0o644)
	out.Reset()
	if code := run([]string{"-config", good, "-check"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "ok, 3 rules") {
		t.Fatalf("-check on the example: %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	if code := run([]string{"-config", "../../examples/envoy/sketchproxy.yaml", "-check"}, &out, &errb); code != 0 ||
		!strings.HasSuffix(out.String(), ": ok, 0 rules, envoy_rls: 2 domains, 4 descriptors (4 with a rate_limit)\n") {
		t.Errorf("-check on the Envoy example: %d %q %q", code, out.String(), errb.String())
	}
	for _, c := range []struct {
		file, body string
		code       int
		want       string
	}{
		{"bad.yaml", "upstream: \"http://127.0.0.1:1\"\nrules:\n  - name: a\n    limits:\n      - {requests: 5, per: forever}\n", 1, `bad.yaml:5: rules[0].limits[0].per: duration "forever"`},
		{"noup.yaml", "rules:\n  - limits: [{requests: 1, per: 1s}]\n", 1, "upstream: missing"},
		{"missing.yaml", "", 1, "no such file"},
	} {
		p := filepath.Join(dir, c.file)
		if c.body != "" {
			os.WriteFile(p, []byte(c.body), 0o644)
		}
		errb.Reset()
		if code := run([]string{"-config", p, "-check"}, io.Discard, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d, %q; want %d and %q", c.file, code, errb.String(), c.code, c.want)
		}
	}
	if code := run([]string{"-nope"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("unknown flag: exit %d", code)
	}
	if code := run([]string{"extra"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("extra argument: exit %d", code)
	}
}

// Streams and upgrades pass through the middleware and the reverse proxy:
// server-sent events arrive one at a time, and a WebSocket-style upgrade
// carries bytes both ways.
func TestStreamingAndUpgrade(t *testing.T) {
	next := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sse":
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			http.NewResponseController(w).Flush()
			<-next // the client must have read "one" before "two" exists
			fmt.Fprint(w, "data: two\n\n")
		case "/ws":
			if r.Header.Get("Upgrade") != "websocket" {
				http.Error(w, "want an upgrade", 400)
				return
			}
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			buf := make([]byte, 4)
			io.ReadFull(brw, buf)
			conn.Write(buf) // echo
		}
	}))
	defer up.Close()
	target, _ := url.Parse(up.URL)
	cfg, err := sketchproxy.ParseConfig("t", []byte("rules:\n  - limits: [{requests: 100, per: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var mw *sketchproxy.Middleware
	mw, err = sketchproxy.New(cfg, newReverseProxy(target, time.Minute, log, func(pr *httputil.ProxyRequest) { mw.SetForwarded(pr) }), sketchproxy.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	px := httptest.NewServer(mw)
	defer px.Close()

	resp, err := http.Get(px.URL + "/sse")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, _ := br.ReadString('\n')
	if line != "data: one\n" {
		t.Fatalf("first event %q", line)
	}
	if resp.Header.Get("RateLimit") == "" {
		t.Error("no RateLimit header on the stream")
	}
	close(next)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if !strings.Contains(string(rest), "data: two") {
		t.Fatalf("second event %q", rest)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	cr := bufio.NewReader(conn)
	status, _ := cr.ReadString('\n')
	if !strings.HasPrefix(status, "HTTP/1.1 101") {
		t.Fatalf("upgrade answered %q", status)
	}
	for l, _ := cr.ReadString('\n'); l != "\r\n" && l != ""; l, _ = cr.ReadString('\n') {
	}
	conn.Write([]byte("ping"))
	buf := make([]byte, 4)
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(cr, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the upgrade: %q %v", buf, err)
	}
}

// lockedBuffer collects a process's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func waitFor(t *testing.T, out *lockedBuffer, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %v in %q", re, out.String())
	return nil
}

// awayFromTickEdge waits, if need be, until the wall clock's next tick
// edge is at least need away (at most half a tick), so that a short burst
// of requests that takes less than need sees no halving. It sleeps only
// when the edge is that close: a test of 30 s ticks that needs 10 s sleeps
// a third of the time, 5 s on average, where waiting for the first half of
// the tick slept half the time, 7.5 s on average.
func awayFromTickEdge(tick, need time.Duration) {
	need = min(need, tick/2)
	if into := time.Duration(time.Now().UnixNano() % int64(tick)); tick-into < need {
		time.Sleep(tick - into + 10*time.Millisecond)
	}
}

// start runs the binary with its output collected; the test's end kills it.
func start(t *testing.T, bin string, args ...string) (*exec.Cmd, *lockedBuffer) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	out := new(lockedBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, out
}

// built is the sketchproxy binary, built once per test binary: every test
// that runs it shares the one build (TestMain removes it).
var built struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// build returns the binary's path, building it at the first call.
func build(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "sketchproxy-test-"); built.err != nil {
			return
		}
		built.bin = filepath.Join(built.dir, "sketchproxy")
		if out, err := exec.Command("go", "build", "-o", built.bin, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func codes(t *testing.T, u string, n int) string {
	var s []string
	for range n {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		s = append(s, fmt.Sprint(resp.StatusCode))
	}
	return strings.Join(s, " ")
}

// The README command: no config, a demo upstream, a default rule, and a
// curl loop that shows the limit.
func TestBinaryDemo(t *testing.T) {
	bin := build(t)
	cmd, out := start(t, bin, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	m := waitFor(t, out, regexp.MustCompile(`curl -s -o /dev/null -w '%\{http_code\} ' (http://127\.0\.0\.1:\d+/)`))
	awayFromTickEdge(5*time.Second, 5*time.Second) // the demo's tick: counts halve at its edges
	if got := codes(t, m[1], 7); got != "200 200 200 200 200 429 429" {
		t.Errorf("the demo loop answered %s", got)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil || !strings.Contains(out.String(), "msg=stopped") {
		t.Fatalf("shutdown: %v\n%s", err, out.String())
	}
}

// SIGHUP applies a valid config, keeps the running one when the new one is
// invalid, and SIGTERM shuts down gracefully.
func TestBinaryReload(t *testing.T) {
	bin := build(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up\n") }))
	defer up.Close()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "proxy.yaml")
	statePath := filepath.Join(dir, "state")
	write := func(limit string) {
		os.WriteFile(cfgPath, []byte(fmt.Sprintf("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nupstream: %q\nstate_file: %q\nrules:\n  - name: r\n    limits: [%s]\n", up.URL, statePath, limit)), 0o644)
	}
	write("{requests: 3, per: 1m}")
	cmd, out := start(t, bin, "-config", cfgPath)
	addr := "http://" + waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1] + "/"
	admin := "http://" + waitFor(t, out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1]
	awayFromTickEdge(30*time.Second, 10*time.Second) // 4 requests, a reload, 3, a reload, ...
	if got := codes(t, addr, 4); got != "200 200 200 429" {
		t.Fatalf("before reload: %s", got)
	}
	write("{requests: 1000, per: 1m}")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, out, regexp.MustCompile(`msg="config reloaded"`))
	if got := codes(t, addr, 3); got != "200 200 200" {
		t.Fatalf("after reload: %s", got)
	}
	write("{requests: 0, per: 1m}")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, out, regexp.MustCompile(`reload failed: keeping the running config.*requests 0`))
	if got := codes(t, addr, 2); got != "200 200" {
		t.Fatalf("after a bad reload: %s", got)
	}
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `sketchproxy_config_reloads_total{result="invalid"} 1`) {
		t.Errorf("metrics after reloads:\n%s", body)
	}
	if r, err := http.Get(admin + "/healthz"); err != nil || r.StatusCode != 200 {
		t.Errorf("healthz: %v", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "no state file yet") {
		t.Errorf("no word about the state file at start:\n%s", out.String())
	}
	if st, err := os.Stat(statePath); err != nil || st.Size() == 0 {
		t.Errorf("graceful shutdown saved no state: %v", err)
	}
}

// A client that sends its headers slowly (slowloris) is cut off at
// read_header_timeout, while other clients are served.
func TestBinarySlowloris(t *testing.T) {
	bin := build(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "up\n") }))
	defer up.Close()
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf("listen: 127.0.0.1:0\nadmin: \"off\"\nupstream: %q\nserver: {read_header_timeout: 300ms}\nrules:\n  - limits: [{requests: 100, per: 1s}]\n", up.URL)), 0o644)
	_, out := start(t, bin, "-config", cfgPath)
	addr := waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1]
	var conns []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n") // and never the blank line
		conns = append(conns, c)
	}
	if got := codes(t, "http://"+addr+"/", 3); got != "200 200 200" {
		t.Errorf("others while 20 slow clients hang on: %s", got)
	}
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		io.Copy(io.Discard, c) // returns when the proxy closes the connection
		if time.Since(start) >= 5*time.Second {
			t.Fatalf("slow client %d still connected after 5 s", i)
		}
		c.Close()
	}
}
