package testkit

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// RedisServer runs Debian's redis-server on a free loopback port for the
// test, and returns its address (the test is skipped without it, but
// fails in CI).
func RedisServer(t testing.TB) string {
	t.Helper()
	addr, _ := RedisProcess(t)
	return addr
}

// RedisProcess is RedisServer, with the server's process: a test can
// pause it (SIGSTOP) or kill it.
func RedisProcess(t testing.TB) (string, *os.Process) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no redis-server in CI")
		}
		t.Skip("no redis-server (Debian: redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	cmd.Dir = t.TempDir()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !pong(addr); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not answer on %s", addr)
		}
	}
	return addr, cmd.Process
}

// pong reports whether the Redis at addr answers PING (inline command).
func pong(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "+PONG")
}
