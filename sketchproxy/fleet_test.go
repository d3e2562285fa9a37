package sketchproxy

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// With Redis unreachable from the start, limits hold at θ/N locally and
// wallets fail closed, or fall back to θ/N with wallet_on_failure: local.
func TestFleetWithoutRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now
	for _, mode := range []string{"closed", "local"} {
		h := newHarness(t, fmt.Sprintf(`fleet: {redis: %q, secret: "0123456789abcdef", replicas: 3, timeout: 50ms, wallet_on_failure: %s}
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{name: rate, requests: 30, per: 1m}]
  - name: llm
    match: {path_prefix: /llm}
    key: ["header:X-Key"]
    budget: {units: 30, per: 1d}
`, dead, mode))
		passed := 0
		for range 20 {
			if w := h.req("198.51.100.1", "X-Key", "a"); w.Code == 200 {
				passed++
			}
		}
		if passed != 10 {
			t.Errorf("%s: %d of 20 passed with Redis down, want θ/N = 10", mode, passed)
		}
		w := h.reqPath("/llm/chat", "X-Key", "b")
		want := map[string]int{"closed": 503, "local": 200}[mode]
		if w.Code != want {
			t.Errorf("%s: a wallet route with Redis down got %d, want %d: %s", mode, w.Code, want, w.Body.String())
		}
	}
}

func TestFleetConfigErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"fleet: {secret: 0123456789abcdef}\n", "fleet: say where Redis is with exactly one of redis"},
		{"fleet: {redis: x:1, cluster: [y:1], secret: 0123456789abcdef}\n", "exactly one of redis"},
		{"fleet: {redis: nohost, secret: 0123456789abcdef}\n", `fleet.redis: "nohost": want host:port or a redis:// URL`},
		{"fleet: {redis: \"http://x:1\", secret: 0123456789abcdef}\n", "fleet.redis: redis: invalid URL scheme"},
		{"fleet: {redis: \"redis://:pw@x:1\", password: pw2, secret: 0123456789abcdef}\n", "the password is given more than once"},
		{"fleet: {redis: x:1, password_env: SKETCHPROXY_TEST_UNSET, secret: 0123456789abcdef}\n", "SKETCHPROXY_TEST_UNSET is empty or unset"},
		{"fleet: {redis: x:1, password_file: /nonexistent/pw, secret: 0123456789abcdef}\n", "fleet.password_file: open /nonexistent/pw"},
		{"fleet: {redis: x:1, tls: {ca_file: /nonexistent/ca}, secret: 0123456789abcdef}\n", "fleet.tls.ca_file: open /nonexistent/ca"},
		{"fleet: {redis: x:1, tls: {cert_file: a.pem}, secret: 0123456789abcdef}\n", "cert_file and key_file together"},
		{"fleet: {cluster: [x:1], db: 2, secret: 0123456789abcdef}\n", "fleet.db: Redis Cluster has only database 0"},
		{"fleet: {sentinel: {addrs: [x:1]}, secret: 0123456789abcdef}\n", "fleet.sentinel: want master"},
		{"fleet: {redis: x:1, prefix: \"a{b}\", secret: 0123456789abcdef}\n", "fleet.prefix"},
		{"fleet: {redis: x:1, secret: short}\n", "fleet.secret: a per-deployment secret of at least 16 bytes"},
		{"fleet: {redis: x:1, secret: 0123456789abcdef, wallet_on_failure: maybe}\n", `fleet.wallet_on_failure: "maybe": want closed or local`},
		{"fleet: {redis: x:1, secret: 0123456789abcdef, interval: 1ms}\n", "fleet.interval: want 10ms to 1m"},
	} {
		_, err := ParseConfig("f.yaml", []byte(c.src+"rules:\n  - limits: [{requests: 1, per: 1s}]\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}

// A Redis that accepts connections and never answers (slow, or a black
// hole) never delays a request: the network is only on the sync goroutine.
func TestFleetBlackHoleRedisDoesNotDelayRequests(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	h := newHarness(t, fmt.Sprintf(`fleet: {redis: %q, secret: "0123456789abcdef", replicas: 2, interval: 150ms, timeout: 500ms}
rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{name: rate, requests: 1000, per: 1m}]
`, l.Addr().String()))
	// Requests flow until two sync rounds have hung for the whole timeout
	// and failed: a request that waited on one would take 500 ms.
	f := h.mw.fleet
	var slowest time.Duration
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; f.Stats().RoundErrors < 2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("no sync round failed in 30 s against a Redis that never answers (%d rounds)", f.Stats().Rounds)
		}
		start := time.Now()
		h.req("198.51.100.1", "X-Key", fmt.Sprint("k", i%7))
		slowest = max(slowest, time.Since(start))
		time.Sleep(time.Millisecond) // pacing: a request a millisecond
	}
	if slowest >= 250*time.Millisecond {
		t.Errorf("a request took %v while Redis hung: it waited on the network", slowest)
	}
	// Down, each of the 2 replicas enforces the limit at half: a quiet key
	// gets 500 of its burst of 1,000 here, not 1,000.
	admitted := 0
	for range 1000 {
		if h.req("198.51.100.1", "X-Key", "solo").Code == http.StatusOK {
			admitted++
		}
	}
	if admitted != 500 {
		t.Errorf("with Redis hung, a quiet key got %d of a burst of 1,000 on one of 2 replicas, want 500 (θ/N)", admitted)
	}
}

// Two Limiters in one process with one fleet section (the same id, and
// replicas counted by the heartbeat) enforce one limit between them, as
// two processes do: before each fleet had a name of its own, they wrote
// one record and counted one replica, and admitted the limit twice over.
// Through a real redis-server, on the wall clock: a client at 4x for 2 s.
func TestLimiterFleetsInOneProcess(t *testing.T) {
	addr := testkit.RedisServer(t)
	fc := &FleetConfig{Redis: addr, Secret: "a-secret-of-16-bytes-at-least", ID: "same", Interval: Duration(100 * time.Millisecond)}
	newLimiter := func(fleet *FleetConfig) *Limiter {
		l, err := NewLimiter(LimiterConfig{Requests: 20, Per: time.Second, Fleet: fleet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	ls := [2]*Limiter{newLimiter(fc), newLimiter(fc)}
	alone := newLimiter(nil)
	time.Sleep(300 * time.Millisecond) // both heartbeats in
	fleet, one, sent := 0, 0, 0
	for start := time.Now(); time.Since(start) < 2*time.Second; sent++ {
		if ls[sent%2].Allow("client") {
			fleet++
		}
		if alone.Allow("client") {
			one++
		}
		time.Sleep(12500 * time.Microsecond)
	}
	t.Logf("%d requests: two Limiters of one fleet section admitted %d, one alone %d", sent, fleet, one)
	if float64(fleet) > 1.25*float64(one)+20 {
		t.Errorf("two Limiters of one fleet section in one process admitted %d, one alone %d: they counted as one replica", fleet, one)
	}
}
