package main

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// scrapeValue reads one series of the binary's /metrics.
func scrapeValue(t *testing.T, admin, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}

// Wallets against the binary and a real upstream that reports usage: 50
// clients at once on one key spend exactly the budget on admitted requests
// (refusals cost nothing); usage in a trailer, and usage reported after the
// client left, is charged.
func TestBinaryWallets(t *testing.T) {
	bin := build(t)
	up := newFileUpstream(t)
	px := startProxy(t, bin, fmt.Sprintf(`upstream: %q
rules:
  - name: llm
    match: {path_prefix: /tokens}
    key: ["header:X-API-Key"]
    max_in_flight: 2
    budget: {units: 1000, per: 1h, cost: 10, reconcile_header: X-Tokens-Used}
  - name: stream
    match: {path_prefix: /stream-tokens}
    key: ["header:X-API-Key"]
    budget: {units: 100000, per: 1h, cost: 1, reconcile_header: X-Tokens-Used, reconcile_wait: 10s}
`, up.URL))

	t.Run("refusals cost nothing under 50 concurrent clients", func(t *testing.T) {
		var ok, inFlight, over atomic.Int64
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		var wg sync.WaitGroup
		for range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 400 {
					req, _ := http.NewRequest("GET", "http://"+px.addr+"/tokens?n=10&delay=5ms", nil)
					req.Header.Set("X-API-Key", "sk-shared")
					resp, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					switch {
					case resp.StatusCode == 200:
						ok.Add(1)
					case strings.Contains(string(body), `"in_flight"`):
						inFlight.Add(1)
					case strings.Contains(string(body), `"over_budget"`):
						over.Add(1)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("50 clients on one key: %d admitted, %d refused in flight, %d over budget", ok.Load(), inFlight.Load(), over.Load())
		if ok.Load() != 100 || inFlight.Load() == 0 {
			t.Errorf("%d admitted of a 1,000-unit budget at 10 a request, want 100 (refusals: %d in flight)", ok.Load(), inFlight.Load())
		}
		if got := scrapeValue(t, px.admin, "sketchproxy_budget_reported_units_total"); got != 1000 {
			t.Errorf("reported units %v, want 1000", got)
		}
	})

	send := func(target, key string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+px.addr+target, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body)
	}
	t.Run("a usage report beyond 32 bits spends the wallet", func(t *testing.T) {
		if code, _ := send("/tokens?n=4294967296", "sk-huge"); code != 200 {
			t.Fatalf("%d", code)
		}
		if code, body := send("/tokens?n=1", "sk-huge"); code != 429 || !strings.Contains(body, "over_budget") {
			t.Errorf("after a report of 2^32: %d %s", code, body)
		}
		if code, _ := send("/tokens?n=12abc", "sk-junk"); code != 200 || scrapeValue(t, px.admin, "sketchproxy_budget_reconcile_errors_total") != 1 {
			t.Errorf("a malformed report: %d, errors %v", code, scrapeValue(t, px.admin, "sketchproxy_budget_reconcile_errors_total"))
		}
		if !strings.Contains(px.out.String(), "reconcile header is not a whole number") {
			t.Error("a malformed report was not logged")
		}
	})
	t.Run("reservations hold while requests run", func(t *testing.T) {
		// 2 slow requests at once (max_in_flight 2), reserving 10 each:
		// both fit, and each is charged what it reports (90).
		var wg sync.WaitGroup
		var ok atomic.Int64
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, _ := send("/tokens?n=90&delay=300ms", "sk-slow"); code == 200 {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 2 {
			t.Fatalf("%d of 2 admitted", ok.Load())
		}
		// 180 spent of 1000: 82 more requests of 10 fit, then none.
		n := 0
		for range 100 {
			if code, _ := send("/tokens?n=10", "sk-slow"); code == 200 {
				n++
			}
		}
		if n != 82 {
			t.Errorf("after 2 x 90: %d more requests of 10 fit a 1,000-unit wallet, want 82", n)
		}
	})

	charged := func() float64 { return scrapeValue(t, px.admin, "sketchproxy_budget_reconciled_units_total") }
	waitCharged := func(want float64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for charged() < want && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if got := charged(); got != want {
			t.Errorf("charged beyond cost: %v, want %v", got, want)
		}
	}
	base := charged()
	t.Run("usage in a trailer", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://"+px.addr+"/stream-tokens?n=900&delay=100ms", nil)
		req.Header.Set("X-API-Key", "sk-trailer")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.Trailer.Get("X-Tokens-Used") != "900" {
			t.Errorf("the client lost the trailer: %v", resp.Trailer)
		}
		waitCharged(base + 899)
	})
	t.Run("client gone before the headers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+px.addr+"/stream-tokens?n=900&delay=1s", nil)
		req.Header.Set("X-API-Key", "sk-gone")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		waitCharged(base + 2*899)
	})
	t.Run("client gone mid-stream", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://"+px.addr+"/stream-tokens?n=900&delay=1s", nil)
		req.Header.Set("X-API-Key", "sk-gone2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 10)
		resp.Body.Read(buf)
		resp.Body.Close()
		waitCharged(base + 3*899)
	})
}

// A budget keyed on the verified subject of a JWT (keys fetched from a
// JWKS URL) binds to the identity against the binary.
func TestBinaryJWTBudget(t *testing.T) {
	bin := build(t)
	up := newFileUpstream(t)
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	b64 := base64.RawURLEncoding.EncodeToString
	set, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig", "n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
	}}})
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(set) }))
	defer jwks.Close()
	px := startProxy(t, bin, fmt.Sprintf(`upstream: %q
jwt: {jwks_url: %q, audience: api}
rules:
  - name: llm
    key: ["jwt:sub"]
    budget: {units: 3, per: 1h}
`, up.URL, jwks.URL))
	// Start never waits for the key set (the docs' jwks_url): until the
	// first fetch, a token is refused with 401.
	waitFor(t, px.out, regexp.MustCompile(`msg="jwks fetched"`))
	sign := func(sub string, i int) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"sub": sub, "aud": "api", "jti": strconv.Itoa(i), "exp": time.Now().Add(time.Hour).Unix()})
		tok.Header["kid"] = "k1"
		s, _ := tok.SignedString(key)
		return s
	}
	codes := map[int]int{}
	for i := range 10 {
		r := raw(t, px.addr, "127.0.0.1", "GET", "/echo/", "Authorization", "Bearer "+sign("alice", i))
		codes[r.code]++
	}
	if codes[200] != 3 || codes[429] != 7 {
		t.Errorf("10 fresh tokens of one subject: %v, want 3 allowed and 7 over budget", codes)
	}
	if r := raw(t, px.addr, "127.0.0.1", "GET", "/echo/", "X-API-Key", "anything"); r.code != 401 || r.hdr.Get("WWW-Authenticate") == "" {
		t.Errorf("no token: %d %v", r.code, r.hdr)
	}
}

// The proxy and a real WSGI upstream (Python's wsgiref, which reads
// X_API_Key and X-API-Key alike as HTTP_X_API_KEY) never read the key
// differently: ambiguous requests are refused before the upstream sees
// them, and path rules hold whatever the case or trailing slash.
func TestBinaryKeysAgainstWSGI(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("python3 is needed for the WSGI upstream")
		}
		t.Skip("no python3")
	}
	bin := build(t)
	app := filepath.Join(t.TempDir(), "app.py")
	os.WriteFile(app, []byte(`import sys, json
from wsgiref.simple_server import make_server, WSGIRequestHandler
class Quiet(WSGIRequestHandler):
    def log_message(self, *a): pass
def app(environ, start):
    start("200 OK", [("Content-Type", "application/json")])
    return [json.dumps({"key": environ.get("HTTP_X_API_KEY"), "path": environ.get("PATH_INFO")}).encode()]
srv = make_server("127.0.0.1", 0, app, handler_class=Quiet)
print(srv.server_port, flush=True)
srv.serve_forever()
`), 0o644)
	cmd := exec.Command(py, app)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var port int
	if _, err := fmt.Fscan(out, &port); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, bin, fmt.Sprintf(`upstream: "http://127.0.0.1:%d"
rules:
  - name: day
    match: {path_prefix: /v1/day/}
    key: ["header:X-API-Key"]
    limits: [{requests: 2, per: 1h}]
`, port))
	// The danger: straight to the app, X_API_Key is the key.
	if r := raw(t, fmt.Sprint("127.0.0.1:", port), "127.0.0.1", "GET", "/", "X_API_Key", "k2"); !strings.Contains(r.body, `"key": "k2"`) {
		t.Fatalf("wsgiref no longer reads X_API_Key as the key (%s): the test shows nothing", r.body)
	}
	// With one key header the WSGI app reads the key the proxy counted.
	r := raw(t, px.addr, "127.0.0.1", "GET", "/v1/day/x", "X-API-Key", "k1")
	if r.code != 200 || !strings.Contains(r.body, `"key": "k1"`) {
		t.Fatalf("plain request: %d %s", r.code, r.body)
	}
	for _, c := range []struct {
		name string
		hdr  []string
	}{
		{"underscore alias alone", []string{"X_API_Key", "k2"}},
		{"alias beside the key", []string{"X-API-Key", "k1", "X_API_Key", "k3"}},
		{"the key twice", []string{"X-API-Key", "k1", "X-API-Key", "k4"}},
	} {
		if r := raw(t, px.addr, "127.0.0.1", "GET", "/v1/day/x", c.hdr...); r.code != 400 || strings.Contains(r.body, `"key"`) {
			t.Errorf("%s: %d %s", c.name, r.code, r.body)
		}
	}
	// The second of 2 an hour, then every spelling is over the limit.
	raw(t, px.addr, "127.0.0.1", "GET", "/v1/day/x", "X-API-Key", "k1")
	for _, p := range []string{"/V1/day/x", "/v1/DAY/x", "/v1/day", "/v1/day/", "//v1/day/x"} {
		if r := raw(t, px.addr, "127.0.0.1", "GET", p, "X-API-Key", "k1"); r.code != 429 {
			t.Errorf("%s: %d %s", p, r.code, r.body)
		}
	}
}
