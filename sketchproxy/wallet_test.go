package sketchproxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/epochsketch/epochsketch"
)

// spent is a wallet's spend for key, in units.
func spent(mw *Middleware, rule, key string) uint64 {
	st := mw.state.Load()
	for _, ru := range st.set.Rules {
		if ru.Name == rule && ru.Budget != nil {
			return mw.eng.Spent(ru, key)
		}
	}
	return 0
}

// A request is charged only if every rule admits it: refusals by an
// in-flight cap, by a limit of the same rule or by another rule cost
// nothing.
func TestRefusalsAreNotCharged(t *testing.T) {
	h := newHarness(t, `rules:
  - name: llm
    key: ["header:X-Key"]
    max_in_flight: 1
    limits: [{requests: 3, per: 1h}]
    budget: {units: 1000, per: 1d, cost: 10}
  - name: other
    match: {path_prefix: /v1/}
    key: ["header:X-Other"]
    limits: [{requests: 1, per: 1h}]
`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := httptest.NewRequest("GET", "http://api.test/x", nil).WithContext(ctx)
		r.Header.Set("X-Key", "a")
		r.Header.Set("X-Test-Block", "1")
		h.mw.ServeHTTP(httptest.NewRecorder(), r)
	}()
	for h.upstream.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	for range 20 {
		if w := h.req("198.51.100.1", "X-Key", "a", "X-Other", "o1"); w.Code != 429 || decodeProblem(t, w).Outcome != "in_flight" {
			t.Fatalf("with one in flight: %d %s", w.Code, w.Body.String())
		}
	}
	if got := spent(h.mw, "llm", "a"); got != 10 {
		t.Errorf("20 refusals for max_in_flight: the wallet shows %d spent, want 10 (the one admitted)", got)
	}
	cancel()
	<-done
	// Another rule refuses (X-Other's limit of 1 is spent by the next one).
	h.req("198.51.100.1", "X-Key", "a", "X-Other", "o2")
	for range 5 {
		if w := h.req("198.51.100.1", "X-Key", "a", "X-Other", "o2"); w.Code != 429 {
			t.Fatalf("the other rule: %d", w.Code)
		}
	}
	if got := spent(h.mw, "llm", "a"); got != 20 {
		t.Errorf("refusals by another rule: %d spent, want 20", got)
	}
	// The rule's own limit (3 an hour: the third passes, then refusals).
	for range 5 {
		h.req("198.51.100.1", "X-Key", "a")
	}
	if got := spent(h.mw, "llm", "a"); got != 30 {
		t.Errorf("refusals by the rule's limit: %d spent, want 30", got)
	}
}

// A usage report beyond 32 (or 64) bits is a huge charge, never a free
// one; a malformed one is logged and counted; the metrics say what was
// reported and what was charged.
func TestUsageReports(t *testing.T) {
	for _, c := range []struct {
		report string
		full   bool // the wallet is spent after it
	}{
		{"4294967296", true},
		{"99999999999999999999999999", true},
		{" 500 ", false},
		{"12abc", false},
		{"-5", false},
	} {
		var logs syncBuffer
		cfg, _ := ParseConfig("t", []byte("rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    budget: {units: 100000, per: 1d, cost: 1, reconcile_header: X-Tokens-Used}\n"))
		mw, err := New(cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Tokens-Used", r.Header.Get("X-Test-Tokens"))
		}), Options{Clock: epochsketch.NewManualClock(t0), Seed: 1, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		send := func(tokens string) int {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header.Set("X-Key", "k")
			r.Header.Set("X-Test-Tokens", tokens)
			w := httptest.NewRecorder()
			mw.ServeHTTP(w, r)
			return w.Code
		}
		send(c.report)
		full := send("1") != 200
		if full != c.full {
			t.Errorf("report %q: wallet spent %v, want %v (spent %d)", c.report, full, c.full, spent(mw, "w", "k"))
		}
		malformed := strings.Contains(c.report, "abc") || strings.HasPrefix(c.report, "-")
		if got := mw.met.reconcileErrors.Load(); (got == 1) != malformed {
			t.Errorf("report %q: %d reconcile errors", c.report, got)
		}
		if malformed && !strings.Contains(logs.String(), "reconcile header is not a whole number") {
			t.Errorf("report %q: not logged:\n%s", c.report, logs.String())
		}
		if c.report == " 500 " && (mw.met.reported.Load() != 501 || mw.met.reconciled.Load() != 499) {
			t.Errorf("reported %d, charged beyond cost %d: want 501 and 499", mw.met.reported.Load(), mw.met.reconciled.Load())
		}
		mw.Close()
	}
}

// blockingUpstream holds each request until release, then reports usage.
type blockingUpstream struct {
	release chan struct{}
	arrived chan struct{}
	usage   string
	trailer bool
}

func (u *blockingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.arrived <- struct{}{}
	<-u.release
	if u.trailer {
		w.Header().Set("Trailer", "X-Tokens-Used")
		io.WriteString(w, "streamed reply\n")
		w.Header().Set("X-Tokens-Used", u.usage)
		return
	}
	w.Header().Set("X-Tokens-Used", u.usage)
}

// Requests in flight hold their reservation: with 20 concurrent requests
// that will each use 300 of a 1,000 budget, only as many are admitted as
// their reservations fit, and the overspend is bounded by
// in-flight x (usage - reserve).
func TestReservationsBoundOverspend(t *testing.T) {
	for _, c := range []struct {
		reserve       int
		wantAdmitted  int
		wantSpentMost uint64
	}{
		{300, 3, 1000},  // 3 x 300 fit; the 4th does not
		{100, 8, 2400},  // max_in_flight 8 for budget rules: 8 x 300
		{1000, 1, 1000}, // one at a time
	} {
		up := &blockingUpstream{release: make(chan struct{}), arrived: make(chan struct{}, 64), usage: "300"}
		cfg, err := ParseConfig("t", []byte(fmt.Sprintf("rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    budget: {units: 1000, per: 1d, cost: 1, reserve: %d, reconcile_header: X-Tokens-Used}\n", c.reserve)))
		if err != nil {
			t.Fatal(err)
		}
		mw, err := New(cfg, up, Options{Clock: epochsketch.NewManualClock(t0), Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		codes := make(chan int, 20)
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("X-Key", "k")
				w := httptest.NewRecorder()
				mw.ServeHTTP(w, r)
				codes <- w.Code
			}()
		}
		// Every request has been admitted or refused once no more arrive.
		admitted := 0
		for {
			select {
			case <-up.arrived:
				admitted++
				continue
			case <-time.After(200 * time.Millisecond):
			}
			break
		}
		close(up.release)
		wg.Wait()
		close(codes)
		if admitted != c.wantAdmitted {
			t.Errorf("reserve %d: %d of 20 admitted at once, want %d", c.reserve, admitted, c.wantAdmitted)
		}
		if got := spent(mw, "w", "k"); got > c.wantSpentMost {
			t.Errorf("reserve %d: %d spent, bound %d", c.reserve, got, c.wantSpentMost)
		}
		if held := mw.state.Load().set.Rules[0].Budget.Held.Get("w", "k"); held != 0 {
			t.Errorf("reserve %d: %d counts still held after every request ended", c.reserve, held)
		}
		mw.Close()
	}
}

// Usage sent as a trailer is charged, by the handler path and by the
// Transport, and the Transport charges it even when the client has gone.
func TestUsageInTrailersAndAfterTheClientLeft(t *testing.T) {
	// A real upstream that streams and reports usage last.
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		delay, _ := time.ParseDuration(r.URL.Query().Get("delay"))
		if r.URL.Query().Get("where") == "header" {
			time.Sleep(delay)
			w.Header().Set("X-Tokens-Used", "900")
			io.WriteString(w, "ok\n")
			return
		}
		w.Header().Set("Trailer", "X-Tokens-Used")
		for range 5 {
			io.WriteString(w, strings.Repeat("x", 1000)+"\n")
			http.NewResponseController(w).Flush()
			time.Sleep(delay / 5)
		}
		w.Header().Set("X-Tokens-Used", "900")
	}))
	defer upstream.Close()
	cfg, err := ParseConfig("t", []byte("rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    budget: {units: 100000, per: 1d, cost: 1, reconcile_header: X-Tokens-Used, reconcile_wait: 5s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	proxy := &httputilProxy{target: upstream.URL}
	mw, err := New(cfg, proxy, Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	proxy.init(mw.Transport(nil))
	px := httptest.NewServer(mw)
	defer px.Close()
	get := func(key, query string, timeout time.Duration, readAll bool) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", px.URL+"/?"+query, nil)
		req.Header.Set("X-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return // the client gave up: that is the point
		}
		if readAll {
			io.Copy(io.Discard, resp.Body)
		} else {
			buf := make([]byte, 100)
			resp.Body.Read(buf)
		}
		resp.Body.Close()
	}
	waitSpent := func(key string, want uint64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for spent(mw, "w", key) < want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := spent(mw, "w", key); got != want {
			t.Errorf("%s: %d spent, want %d", key, got, want)
		}
	}
	get("trailer", "where=trailer&delay=50ms", 5*time.Second, true)
	waitSpent("trailer", 900)
	get("gone-before-headers", "where=header&delay=300ms", 50*time.Millisecond, true)
	waitSpent("gone-before-headers", 900)
	get("gone-mid-stream", "where=trailer&delay=500ms", 5*time.Second, false)
	waitSpent("gone-mid-stream", 900)
}

// Keys first seen during a spike of new keys get budget_factor of the
// budget too.
func TestKeyRotationMeetsBudgets(t *testing.T) {
	h := newHarness(t, `new_keys: {min_per_second: 20, warmup: 1s}
rules:
  - name: w
    key: ["header:X-Key"]
    budget: {units: 1000, per: 1d, cost: 100}
`)
	h.clk.Advance(2 * time.Second)
	allowed := 0
	for i := range 300 {
		for range 10 {
			if h.req("198.51.100.1", "X-Key", fmt.Sprint("fresh", i)).Code == 200 {
				allowed++
			}
		}
	}
	// Without the defense: 300 x 10. The first 20 or so keys pass before
	// the meter sees the spike; the rest get a quarter: 2 of 10.
	if allowed > 300*10/3 {
		t.Errorf("300 fresh keys spent %d requests of 100 units; a quarter of the budget is 2 or 3 each", allowed)
	}
	t.Logf("300 fresh keys, 10 requests each of a 1,000-unit budget at 100 a request: %d allowed", allowed)
}

// Budgets above 2^23 units take a unit; charges round up to whole units.
func TestBudgetUnit(t *testing.T) {
	if _, err := ParseConfig("t", []byte("rules:\n  - budget: {units: 10000000, per: 1d}\n")); err == nil || !strings.Contains(err.Error(), "set unit: 2 or more") {
		t.Errorf("10M without a unit: %v", err)
	}
	h := newHarness(t, "rules:\n  - name: w\n    key: [\"header:X-Key\"]\n    budget: {units: 10000000, per: 1d, unit: 1000, cost: 1000, reconcile_header: X-Tokens-Used}\n")
	for range 9 {
		if w := h.req("198.51.100.1", "X-Key", "k", "X-Test-Tokens", "1000001"); w.Code != 200 {
			t.Fatalf("%d", w.Code)
		}
	}
	// 9 x 1,000,001 tokens = 9 x 1,001 counts of 1,000.
	if got := spent(h.mw, "w", "k"); got != 9*1001*1000 {
		t.Errorf("spent %d, want %d", got, 9*1001*1000)
	}
	if w := h.req("198.51.100.1", "X-Key", "k", "X-Test-Tokens", "1000001"); w.Code != 200 {
		t.Errorf("the 10th million: %d", w.Code)
	}
	if w := h.req("198.51.100.1", "X-Key", "k"); w.Code != 429 {
		t.Errorf("past 10M tokens: %d", w.Code)
	}
}

// An admission miss (the lottery did not take the key) says to retry soon.
func TestBudgetUnknownRetriesSoon(t *testing.T) {
	h := newHarness(t, "sketch: {buckets: 1}\nrules:\n  - name: llm\n    key: [\"header:X-Key\"]\n    budget: {units: 100000, per: 1d, cost: 1}\n")
	for k := range 8 {
		for range 20 {
			h.req("198.51.100.1", "X-Key", fmt.Sprint("whale", k), "X-Test-Tokens", "900")
		}
	}
	w := h.req("198.51.100.1", "X-Key", "newcomer")
	if w.Code != 503 || w.Header().Get("Retry-After") != "1" {
		t.Errorf("an admission miss: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

// jwtKeys makes the keys the JWT tests sign with.
type jwtKeys struct {
	rsa     *rsa.PrivateKey
	ec      *ecdsa.PrivateKey
	pubFile string
	secret  []byte
	secFile string
	jwks    []byte
}

func newJWTKeys(t *testing.T) *jwtKeys {
	dir := t.TempDir()
	k := &jwtKeys{}
	k.rsa, _ = rsa.GenerateKey(rand.Reader, 2048)
	k.ec, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	k.pubFile = filepath.Join(dir, "pub.pem")
	os.WriteFile(k.pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
	k.secret = []byte("0123456789abcdef0123456789abcdef-secret")
	k.secFile = filepath.Join(dir, "secret")
	os.WriteFile(k.secFile, k.secret, 0o600)
	b64 := base64.RawURLEncoding.EncodeToString
	k.jwks, _ = json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
		"n": b64(k.rsa.N.Bytes()), "e": b64(big.NewInt(int64(k.rsa.E)).Bytes()),
	}}})
	return k
}

func (k *jwtKeys) sign(t *testing.T, method jwt.SigningMethod, key any, claims jwt.MapClaims) string {
	tok := jwt.NewWithClaims(method, claims)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A budget keyed on a verified token's subject binds to the identity:
// fresh tokens for the same subject share one wallet, and forged, expired,
// unsigned or missing tokens are refused with 401.
func TestJWTKeys(t *testing.T) {
	k := newJWTKeys(t)
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(k.jwks) }))
	defer jwks.Close()
	now := time.Now()
	good := func(sub string, i int) jwt.MapClaims {
		return jwt.MapClaims{"sub": sub, "jti": fmt.Sprint(i), "iss": "https://id.test", "exp": now.Add(time.Hour).Unix()}
	}
	for _, src := range []string{
		"public_key_file: " + k.pubFile,
		"jwks_url: " + jwks.URL,
		"hmac_secret_file: " + k.secFile,
	} {
		hmac := strings.HasPrefix(src, "hmac")
		h := newHarness(t, "jwt: {"+src+", issuer: \"https://id.test\"}\nrules:\n  - name: w\n    key: [\"jwt:sub\"]\n    budget: {units: 5, per: 1d}\n")
		signGood := func(c jwt.MapClaims) string {
			if hmac {
				return k.sign(t, jwt.SigningMethodHS256, k.secret, c)
			}
			return k.sign(t, jwt.SigningMethodRS256, k.rsa, c)
		}
		allowed := 0
		for i := range 20 { // a new token each time, one subject
			if w := h.req("198.51.100.1", "Authorization", "Bearer "+signGood(good("alice", i))); w.Code == 200 {
				allowed++
			}
		}
		if allowed != 5 {
			t.Errorf("%s: 20 fresh tokens of one subject: %d allowed, want the budget's 5", src, allowed)
		}
		if w := h.req("198.51.100.1", "Authorization", "Bearer "+signGood(good("bob", 0))); w.Code != 200 {
			t.Errorf("%s: another subject: %d", src, w.Code)
		}
		pubPEM, _ := os.ReadFile(k.pubFile)
		for name, tok := range map[string]string{
			"signed by another key": k.sign(t, jwt.SigningMethodES256, k.ec, good("mallory", 1)),
			"expired":               signGood(jwt.MapClaims{"sub": "mallory", "iss": "https://id.test", "exp": now.Add(-time.Hour).Unix()}),
			"another issuer":        signGood(jwt.MapClaims{"sub": "mallory", "iss": "https://evil.test", "exp": now.Add(time.Hour).Unix()}),
			"no sub":                signGood(jwt.MapClaims{"iss": "https://id.test", "exp": now.Add(time.Hour).Unix()}),
			"alg none": func() string {
				s, _ := jwt.NewWithClaims(jwt.SigningMethodNone, good("mallory", 2)).SignedString(jwt.UnsafeAllowNoneSignatureType)
				return s
			}(),
			"HS256 with the RSA key": k.sign(t, jwt.SigningMethodHS256, pubPEM, good("mallory", 3)),
			"garbage":                "not.a.token",
			"a tampered payload":     tamper(signGood(good("mallory", 4))),
		} {
			w := h.req("198.51.100.1", "Authorization", "Bearer "+tok)
			if hmac && name == "HS256 with the RSA key" {
				continue // a different secret: refused like any other
			}
			if w.Code != 401 || !strings.Contains(w.Header().Get("WWW-Authenticate"), `error="invalid_token"`) {
				t.Errorf("%s: %s: %d %q", src, name, w.Code, w.Header().Get("WWW-Authenticate"))
			}
		}
		if w := h.req("198.51.100.1"); w.Code != 401 || w.Header().Get("WWW-Authenticate") != `Bearer realm="sketchproxy"` {
			t.Errorf("%s: no token: %d %q", src, w.Code, w.Header().Get("WWW-Authenticate"))
		}
		if w := h.req("198.51.100.1", "Authorization", "Basic YTpi"); w.Code != 401 {
			t.Errorf("%s: basic auth: %d", src, w.Code)
		}
	}
}

// A token without exp never expires: refused as an invalid token (401)
// unless jwt.require_exp is false; one with exp passes either way.
func TestJWTRequireExp(t *testing.T) {
	k := newJWTKeys(t)
	noExp := k.sign(t, jwt.SigningMethodHS256, k.secret, jwt.MapClaims{"sub": "alice"})
	withExp := k.sign(t, jwt.SigningMethodHS256, k.secret, jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	for _, c := range []struct {
		setting string
		noExp   int
	}{
		{"", 401},
		{", require_exp: true", 401},
		{", require_exp: false", 200},
	} {
		h := newHarness(t, "jwt: {hmac_secret_file: "+k.secFile+c.setting+"}\nrules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 100, per: 1m}]\n")
		w := h.req("198.51.100.1", "Authorization", "Bearer "+noExp)
		if w.Code != c.noExp || c.noExp == 401 && !strings.Contains(w.Header().Get("WWW-Authenticate"), `error="invalid_token"`) {
			t.Errorf("jwt {hmac_secret_file%s}: a token without exp: %d %q, want %d", c.setting, w.Code, w.Header().Get("WWW-Authenticate"), c.noExp)
		}
		if w := h.req("198.51.100.1", "Authorization", "Bearer "+withExp); w.Code != 200 {
			t.Errorf("jwt {hmac_secret_file%s}: a token with exp: %d", c.setting, w.Code)
		}
	}
}

// tamper changes the payload's subject and keeps the signature.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	p, _ := base64.RawURLEncoding.DecodeString(parts[1])
	p = []byte(strings.Replace(string(p), "mallory", "alice!!", 1))
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}

func TestJWTConfigErrors(t *testing.T) {
	k := newJWTKeys(t)
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("tiny"), 0o600)
	for _, c := range []struct{ src, want string }{
		{"rules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 1, per: 1s}]\n", `"jwt:sub" needs a jwt section`},
		{"jwt: {}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "give exactly one of"},
		{"jwt: {hmac_secret_file: " + short + "}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "use at least 32 random bytes"},
		{"jwt: {public_key_file: " + k.secFile + "}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "no PEM block"},
		{"jwt: {public_key_file: " + k.pubFile + ", algorithms: [HS256]}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `"HS256" does not fit the key`},
		{"jwt: {jwks_url: \"ftp://x\"}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "want an https:// URL"},
	} {
		if _, err := ParseConfig("j.yaml", []byte(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}

// httputilProxy is an httputil.ReverseProxy whose transport is set after
// the Middleware in front of it exists.
type httputilProxy struct {
	target string
	rp     *httputil.ReverseProxy
}

func (p *httputilProxy) init(rt http.RoundTripper) {
	u, _ := url.Parse(p.target)
	p.rp = &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: rt}
}

func (p *httputilProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.rp.ServeHTTP(w, r) }
