package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// send writes a request exactly as given from the loopback address from
// and reads the answer's status and body.
func send(t *testing.T, addr, from, request string) (int, string) {
	t.Helper()
	r := sendRaw(t, addr, from, request)
	return r.code, r.body
}

// The doors against the built binary: the check's path is never proxied on
// the main listener, Host, method and path spellings are judged as the
// upstream routes them, a silent upstream gets 504, and a reload names the
// settings that wait for a restart.
func TestBinaryDoors(t *testing.T) {
	bin := build(t)
	var hits atomic.Int64
	release := make(chan struct{})
	defer close(release)
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/hang":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/stall":
			w.Write([]byte("part of the body"))
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		default:
			fmt.Fprintf(w, "host=%s path=%s\n", r.Host, r.URL.Path)
		}
	})}
	uln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(uln)
	defer up.Close()
	cfgPath := filepath.Join(t.TempDir(), "proxy.yaml")
	write := func(idle string) {
		os.WriteFile(cfgPath, []byte(fmt.Sprintf(`listen: 127.0.0.1:0
admin: "off"
upstream: "http://%s"
server: {upstream_timeout: 1s, idle_timeout: %s}
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {gateway: caddy}
rules:
  - name: host
    match: {host: api.example.com}
    limits: [{requests: 2, per: 1m}]
  - name: api
    match: {path_prefix: /api/}
    limits: [{requests: 1, per: 1m}]
`, uln.Addr(), idle)), 0o644)
	}
	write("2m")
	cmd, out := start(t, bin, "-config", cfgPath)
	addr := waitFor(t, out, regexp.MustCompile(`msg="sketchproxy listening" addr=(\S+)`))[1]
	const client = "127.0.0.2" // not the trusted gateway
	get := func(target, host string) int {
		code, _ := send(t, addr, client, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n")
		return code
	}
	awayFromTickEdge(30*time.Second, 10*time.Second) // a dozen requests

	for _, target := range []string{"/check?x", "/check?q=hello", "//check", "/./check", "/CHECK", "/%63heck"} {
		if code := get(target, "app.test"); code != http.StatusForbidden {
			t.Errorf("a client asking %s: %d, want the check's 403", target, code)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("the check's path reached the upstream %d times", n)
	}

	var codes []int
	for _, host := range []string{"API.example.com.", "api.example.com:8080"} {
		codes = append(codes, get("/x", host))
	}
	c10, _ := send(t, addr, client, "GET /x HTTP/1.0\r\n\r\n") // no Host: the upstream's default host
	codes = append(codes, c10)
	if fmt.Sprint(codes) != "[200 200 429]" {
		t.Errorf("two spellings of api.example.com, then HTTP/1.0 without Host, at 2 a minute: %v, want [200 200 429]", codes)
	}
	if code := get("/x", "api.example.com:80:80"); code != http.StatusBadRequest {
		t.Errorf("Host api.example.com:80:80: %d, want 400", code)
	}
	_, body := send(t, addr, "127.0.0.3", "GET /x HTTP/1.1\r\nHost: Other.Example.COM.:8080\r\nConnection: close\r\n\r\n")
	if !strings.Contains(body, "host=other.example.com:8080 ") {
		t.Errorf("the upstream was not sent the canonical Host: %q", body)
	}

	before := hits.Load()
	if code, _ := send(t, addr, client, "CONNECT internal.example:22 HTTP/1.1\r\nHost: internal.example:22\r\n\r\n"); code != http.StatusMethodNotAllowed {
		t.Errorf("CONNECT: %d, want 405", code)
	}
	if hits.Load() != before {
		t.Errorf("CONNECT reached the upstream")
	}
	if a, b := get("/api;jsessionid=1/x", "app.test"), get("/api;/x", "app.test"); a != 200 || b != 429 {
		t.Errorf("/api;jsessionid=1/x then /api;/x under /api/ at 1 a minute: %d %d, want 200 429", a, b)
	}

	// A silent upstream: 504 after upstream_timeout, not a client held
	// forever; a body that stops is cut off.
	begin := time.Now()
	if code, body := send(t, addr, "127.0.0.4", "GET /hang HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n"); code != http.StatusGatewayTimeout || !strings.Contains(body, "upstream_timeout") {
		t.Errorf("a silent upstream: %d %q, want 504", code, body)
	}
	if d := time.Since(begin); d < time.Second {
		t.Errorf("504 after %v, before the 1s upstream_timeout", d)
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.5")}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "GET /stall HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
	all, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Errorf("a stalled body held the client 30 s: %q", all)
	}
	if !strings.Contains(string(all), "part of the body") {
		t.Errorf("the stalled body's start did not arrive: %q", all)
	}

	// A reload that changes a server setting says it waits for a restart.
	write("5m")
	cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, out, regexp.MustCompile(`config reloaded, except settings that take a restart.*restart_for=server.idle_timeout`))
}
