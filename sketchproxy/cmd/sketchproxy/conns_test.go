package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// idleConns opens n connections to addr from the loopback address from,
// each sending only what it is given ("PRI", the first bytes of HTTP/2's
// preface, or nothing), and leaves them open.
func idleConns(t *testing.T, from, addr string, n int, send string) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	var cs []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d from %s: %v", len(cs)+1, n, from, err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write([]byte(send))
		cs = append(cs, c)
	}
	return cs
}

// promptly sends request to addr from 127.0.0.1 and reads the answer's
// status, or says why none came within 3 s.
func promptly(addr, request string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprint(c, request)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// openAt counts the connections of cs the server has not closed by
// deadline (a read past its deadline times out even with the close
// already here: each gets 50 ms at least).
func openAt(cs []net.Conn, deadline time.Time) int {
	open := 0
	for _, c := range cs {
		d := time.Now().Add(50 * time.Millisecond)
		if deadline.After(d) {
			d = deadline
		}
		c.SetReadDeadline(d)
		if _, err := c.Read(make([]byte, 64)); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				open++
			}
		}
	}
	return open
}

// Envoy's service and the HTTP doors in one process, with 256 file
// descriptors: 300 connections from one peer that send only "PRI" and 40
// silent ones on admin took every descriptor, so that a new
// ShouldRateLimit call (Envoy fails open) and the forward-auth check
// (nginx answers 500) timed out. Now a peer's connections past its cap are
// closed at accept, the gRPC listener never holds more than a quarter of
// the descriptors whatever the peers, the "PRI" connections are closed at
// envoy_rls.connection_timeout, and admin's keep-alives at
// server.idle_timeout.
func TestBinaryListenerCaps(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(path, []byte(`admin: "127.0.0.1:0"
server: {idle_timeout: 1s}
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {listen: "127.0.0.1:0", path: /check}
envoy_rls:
  listen: "127.0.0.1:0"
  connection_timeout: 1s
  max_connections_per_client: 16
  domains:
    - domain: d
      descriptors:
        - key: user
          rate_limit: {unit: minute, requests_per_unit: 1000}
rules:
  - limits: [{requests: 1000, per: 1s}]
`), 0o644)
	// The shell lowers the limit for the binary alone (exec keeps the pid).
	_, out := start(t, "sh", "-c", `ulimit -n 256 && exec "$0" "$@"`, bin, "-config", path)
	grpcAddr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	adminAddr := waitFor(t, out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1]
	checkAddr := waitFor(t, out, regexp.MustCompile(`msg="forward_auth listening" addr=(\S+)`))[1]

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	doorsAnswer := func(when string) {
		t.Helper()
		if code, err := promptly(checkAddr, "GET /check HTTP/1.1\r\nHost: app\r\nX-Original-Method: GET\r\nX-Original-URI: /\r\nConnection: close\r\n\r\n"); err != nil || code != 200 {
			t.Errorf("%s: the check answered %d, %v", when, code, err)
		}
		if code, err := promptly(adminAddr, "GET /metrics HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"); err != nil || code != 200 {
			t.Errorf("%s: admin /metrics answered %d, %v", when, code, err)
		}
	}

	began := time.Now()
	pri := idleConns(t, "127.0.0.2", grpcAddr, 300, "PRI")
	silent := idleConns(t, "127.0.0.2", adminAddr, 40, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err = rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
	cancel()
	if err != nil {
		t.Errorf("a new ShouldRateLimit call while one peer holds 300 \"PRI\" connections: %v", err)
	}
	doorsAnswer("one peer holding 300 gRPC and 40 admin connections")
	if n := openAt(pri, began.Add(4*time.Second)); n != 0 {
		t.Errorf("%d \"PRI\" connections still open 4 s after connection_timeout: 1s", n)
	}
	if n := openAt(silent, began.Add(8*time.Second)); n != 0 {
		t.Errorf("%d silent admin connections still open 8 s on, past admin's 5 s header timeout", n)
	}

	// Many peers, 16 each: the listener's total (a quarter of 256) holds,
	// and the HTTP doors keep their descriptors.
	var many []net.Conn
	for p := range 10 {
		many = append(many, idleConns(t, fmt.Sprintf("127.0.0.%d", p+3), grpcAddr, 16, "PRI")...)
	}
	waitFor(t, out, regexp.MustCompile(`msg="connection closed at accept" listener=envoy_rls peer=127\.0\.0\.\d+ cap=total max_connections=64 `))
	doorsAnswer("10 peers holding 160 gRPC connections")
	if n := openAt(many, time.Now()); n > 64 {
		t.Errorf("%d gRPC connections held, past the total of 64", n)
	}

	// Admin's keep-alives end at server.idle_timeout (they never did).
	c, err := net.DialTimeout("tcp", adminAddr, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: admin\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Errorf("admin's idle keep-alive still open 3 s after an answer, past idle_timeout: 1s (%v)", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
