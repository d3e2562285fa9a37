package sketchproxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/epochsketch/epochsketch"
)

// pinned is a door with its log and counters in view, for tests that pin
// whole answers.
type pinned struct {
	*harness
	logs bytes.Buffer
}

func newPinned(t *testing.T, yaml string) *pinned {
	t.Helper()
	cfg, err := ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	p := &pinned{harness: &harness{t: t, clk: epochsketch.NewManualClock(t0)}}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.upstream.Add(1)
		if r.Header.Get("X-Test-Block") != "" {
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "upstream ok\n")
	})
	drop := func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == "since" || a.Key == "seconds" {
			return slog.Attr{}
		}
		return a
	}
	p.mw, err = New(cfg, up, Options{
		Clock: p.clk, Seed: 1,
		Logger: slog.New(slog.NewTextHandler(&p.logs, &slog.HandlerOptions{ReplaceAttr: drop})),
		Sleep:  func(context.Context, time.Duration) error { return nil },
		// No summary line may fall inside a case, however slow the machine.
		RefusalLogInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.mw.Close() })
	return p
}

// answer is w's whole answer, its status, headers (sorted) and body, then
// the log lines and the counters of refusals the door does not leave to
// the engine, since the last answer.
func (p *pinned) answer(w *httptest.ResponseRecorder) string {
	var b strings.Builder
	res := w.Result()
	fmt.Fprintf(&b, "%d\n", res.StatusCode)
	names := make([]string, 0, len(res.Header))
	for n := range res.Header {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%s: %s\n", n, strings.Join(res.Header[n], ", "))
	}
	fmt.Fprintf(&b, "%s", w.Body.String())
	b.WriteString(p.logs.String())
	p.logs.Reset()
	m := &p.mw.met
	fmt.Fprintf(&b, "bad=%d unauthorized=%d client_cap=%d body_timeouts=%d\n",
		m.badRequests.Load(), m.unauthorized.Load(), m.clientCap.Load(), m.bodyTimeouts.Load())
	return b.String()
}

// until sends r() until the answer's problem has outcome o, and returns
// that answer.
func (p *pinned) until(o string, r func() *http.Request) *httptest.ResponseRecorder {
	p.t.Helper()
	for range 200 {
		p.logs.Reset()
		w := p.do(r())
		if strings.Contains(w.Body.String(), `"outcome":"`+o+`"`) {
			return w
		}
	}
	p.t.Fatalf("no %s in 200 requests", o)
	return nil
}

func get(path string, hdr ...string) func() *http.Request {
	return func() *http.Request {
		r := httptest.NewRequest("GET", "http://api.test"+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		return r
	}
}

// errBody is a request body whose reads fail with err.
type errBody struct{ err error }

func (b errBody) Read([]byte) (int, error) { return 0, b.err }
func (b errBody) Close() error             { return nil }

// Every kind of refusal the HTTP doors write, pinned whole: status,
// headers, body, log lines and counters. A change to any of them shows
// here first.
func TestRefusalAnswersPinned(t *testing.T) {
	const limited = "headers: {legacy: true}\nrules:\n  - name: api\n    key: [\"header:X-Key\"]\n    limits: [{name: per-10s, requests: 1, per: 10s}]\n"
	const tarpit = "tarpit: {max_delay: 2s, drip_interval: 100ms, ban_for: 1m}\nrules:\n  - name: t\n    tarpit: true\n    limits: [{requests: 10, per: 10s}]\n"
	keys := newJWTKeys(t)
	jwtYAML := fmt.Sprintf("jwt: {public_key_file: %q}\nrules:\n  - name: user\n    key: [\"jwt:sub\"]\n    limits: [{requests: 5, per: 10s}]\n", keys.pubFile)
	fa := "client_ip: {trusted_proxies: [127.0.0.1/32]}\nforward_auth: {refusal_status: %d}\nrules:\n  - name: api\n    limits: [{requests: 1, per: 10s}]\n"
	check := func(p *pinned, peer, path string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "http://sketchproxy.test"+path, nil)
		r.RemoteAddr = peer + ":5555"
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		p.mw.ForwardAuth().ServeHTTP(w, r)
		return w
	}
	for _, tc := range []struct {
		name, yaml string
		run        func(p *pinned) *httptest.ResponseRecorder
	}{
		{"reject", limited, func(p *pinned) *httptest.ResponseRecorder {
			p.do(get("/v1/x", "X-Key", "k")())
			return p.until("reject", get("/v1/x", "X-Key", "k"))
		}},
		{"reject with a body", limited, func(p *pinned) *httptest.ResponseRecorder {
			p.do(get("/v1/x", "X-Key", "k")())
			return p.until("reject", func() *http.Request {
				r := httptest.NewRequest("POST", "http://api.test/v1/x", strings.NewReader("body"))
				r.Header.Set("X-Key", "k")
				return r
			})
		}},
		{"ban", tarpit, func(p *pinned) *httptest.ResponseRecorder { return p.until("ban", get("/")) }},
		{"drip", tarpit, func(p *pinned) *httptest.ResponseRecorder { return p.until("drip", get("/")) }},
		{"in flight per client", "server: {max_in_flight_per_client: 1}\nrules:\n  - name: api\n    limits: [{requests: 100, per: 10s}]\n", func(p *pinned) *httptest.ResponseRecorder {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.do(get("/", "X-Test-Block", "1")().WithContext(ctx))
			}()
			for p.upstream.Load() == 0 {
				time.Sleep(time.Millisecond)
			}
			w := p.do(get("/")())
			cancel()
			<-done
			return w
		}},
		{"budget unknown", "sketch: {buckets: 1}\nrules:\n  - name: llm\n    key: [\"header:X-Key\"]\n    budget: {units: 100000, per: 1d, cost: 1000}\n", func(p *pinned) *httptest.ResponseRecorder {
			for k := range 8 {
				for range 20 {
					p.do(get("/", "X-Key", fmt.Sprint("whale", k))())
				}
			}
			return p.until("budget_unknown", get("/", "X-Key", "newcomer"))
		}},
		{"key header twice", limited, func(p *pinned) *httptest.ResponseRecorder {
			return p.do(get("/v1/x", "X-Key", "a", "X-Key", "b")())
		}},
		{"bad host with a body", limited, func(p *pinned) *httptest.ResponseRecorder {
			r := httptest.NewRequest("PUT", "http://api.test/v1/x", strings.NewReader("body"))
			r.Host = "a b"
			return p.do(r)
		}},
		{"trace", limited, func(p *pinned) *httptest.ResponseRecorder {
			return p.do(httptest.NewRequest("TRACE", "http://api.test/v1/x", nil))
		}},
		{"no token", jwtYAML, func(p *pinned) *httptest.ResponseRecorder { return p.do(get("/")()) }},
		{"forged token", jwtYAML, func(p *pinned) *httptest.ResponseRecorder {
			tok := keys.sign(t, jwt.SigningMethodHS256, []byte("not the key"), jwt.MapClaims{"sub": "x"})
			return p.do(get("/", "Authorization", "Bearer "+tok)())
		}},
		{"body timeout", limited, func(p *pinned) *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", "http://api.test/v1/x", nil)
			r.Header.Set("X-Key", "k")
			r.Body, r.ContentLength = errBody{os.ErrDeadlineExceeded}, 4
			return p.do(r)
		}},
		{"body too large", limited, func(p *pinned) *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", "http://api.test/v1/x", strings.NewReader("a body"))
			r.Header.Set("X-Key", "k")
			w := httptest.NewRecorder()
			r.Body = http.MaxBytesReader(w, r.Body, 2)
			p.mw.ServeHTTP(w, r)
			return w
		}},
		{"check refused 429", fmt.Sprintf(fa, 429), func(p *pinned) *httptest.ResponseRecorder {
			check(p, "127.0.0.1", "/check", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/x", "X-Forwarded-For", "203.0.113.9")
			return check(p, "127.0.0.1", "/check", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/x", "X-Forwarded-For", "203.0.113.9")
		}},
		{"check refused 403", fmt.Sprintf(fa, 403), func(p *pinned) *httptest.ResponseRecorder {
			check(p, "127.0.0.1", "/check", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/x", "X-Forwarded-For", "203.0.113.9")
			return check(p, "127.0.0.1", "/check", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/x", "X-Forwarded-For", "203.0.113.9")
		}},
		{"check bad request 403", fmt.Sprintf(fa, 403), func(p *pinned) *httptest.ResponseRecorder {
			return check(p, "127.0.0.1", "/check", "X-Forwarded-Uri", "/x")
		}},
		{"check untrusted caller", fmt.Sprintf(fa, 429), func(p *pinned) *httptest.ResponseRecorder {
			return check(p, "203.0.113.1", "/check", "X-Forwarded-Method", "GET", "X-Forwarded-Uri", "/x")
		}},
		{"check elsewhere", fmt.Sprintf(fa, 429), func(p *pinned) *httptest.ResponseRecorder {
			return check(p, "127.0.0.1", "/other")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPinned(t, tc.yaml)
			p.t = t
			got := p.answer(tc.run(p))
			if !strings.HasPrefix(got, "4") && !strings.HasPrefix(got, "5") {
				t.Fatalf("not a refusal:\n%s", got)
			}
			if want := pinnedAnswers[tc.name]; got != want {
				t.Errorf("got\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// pinnedAnswers are the answers TestRefusalAnswersPinned expects, by case.
var pinnedAnswers = map[string]string{
	"reject": `429
Cache-Control: no-store
Content-Length: 306
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
Retry-After: 7
X-Ratelimit-Limit: 1
X-Ratelimit-Remaining: 0
X-Ratelimit-Reset: 7
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"rule \"api\" limit \"per-10s\": 1 requests per 10s; retry after 7 s","rule":"api","limit":"per-10s","outcome":"reject","retry_after":7,"level":2,"violated-policies":["api-per-10s"]}
level=INFO msg="sketchproxy decision" rule=api outcome=reject shadow=false key=k:384b9adc5b9e method=GET path=/v1/x retry_after_s=7 limit=per-10s estimate=2 threshold=1
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"reject with a body": `429
Cache-Control: no-store
Connection: close
Content-Length: 306
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
Retry-After: 7
X-Ratelimit-Limit: 1
X-Ratelimit-Remaining: 0
X-Ratelimit-Reset: 7
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"rule \"api\" limit \"per-10s\": 1 requests per 10s; retry after 7 s","rule":"api","limit":"per-10s","outcome":"reject","retry_after":7,"level":2,"violated-policies":["api-per-10s"]}
level=INFO msg="sketchproxy decision" rule=api outcome=reject shadow=false key=k:384b9adc5b9e method=POST path=/v1/x retry_after_s=7 limit=per-10s estimate=2 threshold=1
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"ban": `429
Cache-Control: no-store
Connection: close
Content-Length: 322
Content-Type: application/problem+json
Ratelimit: "t-per-10s";r=0;t=21
Ratelimit-Policy: "t-per-10s";q=10;w=10
Retry-After: 70
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"temporarily banned: rule \"t\" limit \"per-10s\": 10 requests per 10s; retry after 70 s","rule":"t","limit":"per-10s","outcome":"ban","retry_after":70,"level":8.1,"violated-policies":["t-per-10s"]}
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"drip": `429
Cache-Control: no-store
Content-Length: 301
Content-Type: application/problem+json
Ratelimit: "t-per-10s";r=0;t=5
Ratelimit-Policy: "t-per-10s";q=10;w=10
Retry-After: 5
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"rule \"t\" limit \"per-10s\": 10 requests per 10s; retry after 5 s","rule":"t","limit":"per-10s","outcome":"drip","retry_after":5,"level":1.6,"violated-policies":["t-per-10s"]}
level=INFO msg="sketchproxy decision" rule=t outcome=drip shadow=false key=k:ce20ca126abe method=GET path=/ retry_after_s=5 limit=per-10s estimate=16 threshold=10
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"in flight per client": `429
Cache-Control: no-store
Content-Length: 197
Content-Type: application/problem+json
Retry-After: 1
{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"too many requests in progress from this client address; retry when one has finished","outcome":"in_flight","retry_after":1}
level=INFO msg="sketchproxy decision" rule="" outcome=in_flight shadow=false key=k:ce20ca126abe method=GET path=/ retry_after_s=1
bad=0 unauthorized=0 client_cap=1 body_timeouts=0
`,
	"budget unknown": `503
Cache-Control: no-store
Content-Length: 257
Content-Type: application/problem+json
Retry-After: 1
{"type":"about:blank","title":"Service Unavailable","status":503,"detail":"budget \"budget\" cannot be tracked for this client right now, and the route fails closed; retry after 1 s","rule":"llm","limit":"budget","outcome":"budget_unknown","retry_after":1}
level=INFO msg="sketchproxy decision" rule=llm outcome=budget_unknown shadow=false key=k:349612016bbb method=GET path=/ retry_after_s=1
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"key header twice": `400
Cache-Control: no-store
Content-Length: 135
Content-Type: application/problem+json
{"type":"about:blank","title":"Bad Request","status":400,"detail":"the key header X-Key is sent 2 times: send the request without it"}
level=INFO msg="sketchproxy bad request" why="the key header X-Key is sent 2 times" method=GET
bad=1 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"bad host with a body": `400
Cache-Control: no-store
Connection: close
Content-Length: 167
Content-Type: application/problem+json
{"type":"about:blank","title":"Bad Request","status":400,"detail":"the Host \"a b\" is not a host name or address with at most one port: send the request without it"}
level=INFO msg="sketchproxy bad request" why="the Host \"a b\" is not a host name or address with at most one port" method=PUT
bad=1 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"trace": `405
Allow: GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS
Cache-Control: no-store
Content-Length: 147
Content-Type: application/problem+json
{"type":"about:blank","title":"Method Not Allowed","status":405,"detail":"TRACE: this is a reverse proxy; it forwards neither tunnels nor traces"}
bad=1 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"no token": `401
Cache-Control: no-store
Content-Length: 140
Content-Type: application/problem+json
Www-Authenticate: Bearer realm="sketchproxy"
{"type":"about:blank","title":"Unauthorized","status":401,"detail":"this route counts requests per verified identity: send a bearer token"}
bad=0 unauthorized=1 client_cap=0 body_timeouts=0
`,
	"forged token": `401
Cache-Control: no-store
Content-Length: 161
Content-Type: application/problem+json
Www-Authenticate: Bearer realm="sketchproxy", error="invalid_token", error_description="token signature is invalid: signing method HS256 is invalid"
{"type":"about:blank","title":"Unauthorized","status":401,"detail":"the bearer token is not valid: token signature is invalid: signing method HS256 is invalid"}
bad=0 unauthorized=1 client_cap=0 body_timeouts=0
`,
	"body timeout": `408
Cache-Control: no-store
Connection: close
Content-Length: 132
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
X-Ratelimit-Limit: 1
X-Ratelimit-Remaining: 0
X-Ratelimit-Reset: 7
{"type":"about:blank","title":"Request Timeout","status":408,"detail":"the request body did not arrive within server.body_timeout"}
bad=0 unauthorized=0 client_cap=0 body_timeouts=1
`,
	"body too large": `413
Cache-Control: no-store
Content-Length: 112
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
X-Ratelimit-Limit: 1
X-Ratelimit-Remaining: 0
X-Ratelimit-Reset: 7
{"type":"about:blank","title":"Request Entity Too Large","status":413,"detail":"the request body is too large"}
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"check refused 429": `429
Cache-Control: no-store
Content-Length: 306
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
Retry-After: 7
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"detail":"rule \"api\" limit \"per-10s\": 1 requests per 10s; retry after 7 s","rule":"api","limit":"per-10s","outcome":"reject","retry_after":7,"level":2,"violated-policies":["api-per-10s"]}
level=INFO msg="sketchproxy decision" rule=api outcome=reject shadow=false key=k:dcd1de4d4576 method=GET path=/x retry_after_s=7 limit=per-10s estimate=2 threshold=1
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"check refused 403": `403
Cache-Control: no-store
Content-Length: 298
Content-Type: application/problem+json
Ratelimit: "api-per-10s";r=0;t=7
Ratelimit-Policy: "api-per-10s";q=1;w=10
Retry-After: 7
{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Forbidden","status":403,"detail":"rule \"api\" limit \"per-10s\": 1 requests per 10s; retry after 7 s","rule":"api","limit":"per-10s","outcome":"reject","retry_after":7,"level":2,"violated-policies":["api-per-10s"]}
level=INFO msg="sketchproxy decision" rule=api outcome=reject shadow=false key=k:dcd1de4d4576 method=GET path=/x retry_after_s=7 limit=per-10s estimate=2 threshold=1
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"check bad request 403": `403
Cache-Control: no-store
Content-Length: 198
Content-Type: application/problem+json
Sketchproxy-Status: 400
{"type":"about:blank","title":"Bad Request","status":400,"detail":"forward_auth: no X-Forwarded-Method or X-Original-Method: the gateway must send the original method: send the request without it"}
level=INFO msg="sketchproxy bad request" why="forward_auth: no X-Forwarded-Method or X-Original-Method: the gateway must send the original method" method=GET
bad=1 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"check untrusted caller": `403
Cache-Control: no-store
Content-Length: 166
Content-Type: application/problem+json
{"type":"about:blank","title":"Forbidden","status":403,"detail":"forward_auth: the caller 203.0.113.1 is not in client_ip.trusted_proxies: only the gateway may ask"}
bad=1 unauthorized=0 client_cap=0 body_timeouts=0
`,
	"check elsewhere": `404
Cache-Control: no-store
Content-Length: 134
Content-Type: application/problem+json
{"type":"about:blank","title":"Not Found","status":404,"detail":"no upstream here: this address answers only the forward_auth check"}
bad=0 unauthorized=0 client_cap=0 body_timeouts=0
`,
}
