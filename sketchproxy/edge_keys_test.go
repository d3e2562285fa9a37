package sketchproxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// Requests whose key cannot be read one way are refused before any rule
// counts them.
func TestAmbiguousKeysAreRefused(t *testing.T) {
	h := newHarness(t, "rules:\n  - name: k\n    key: [\"header:X-API-Key\", \"query:tenant\"]\n    limits: [{requests: 100, per: 1s}]\n")
	send := func(target string, hdr http.Header) int {
		r := httptest.NewRequest("GET", "http://api.test"+target, nil)
		r.RemoteAddr = "198.51.100.1:1"
		r.Header = hdr
		w := httptest.NewRecorder()
		h.mw.ServeHTTP(w, r)
		return w.Code
	}
	for _, c := range []struct {
		name   string
		target string
		hdr    http.Header
		code   int
	}{
		{"one key", "/?tenant=a", http.Header{"X-Api-Key": {"k1"}}, 200},
		{"two key headers", "/?tenant=a", http.Header{"X-Api-Key": {"k1", "k2"}}, 400},
		{"underscore alias", "/?tenant=a", http.Header{"X-Api-Key": {"k1"}, "X_api_key": {"k2"}}, 400},
		{"underscore alias alone", "/?tenant=a", http.Header{"X_API_KEY": {"k2"}}, 400},
		{"two tenants", "/?tenant=a&tenant=b", http.Header{"X-Api-Key": {"k1"}}, 400},
		{"unrelated underscore header", "/?tenant=a", http.Header{"X-Api-Key": {"k1"}, "X_trace_id": {"1"}}, 200},
	} {
		if got := send(c.target, c.hdr); got != c.code {
			t.Errorf("%s: %d, want %d", c.name, got, c.code)
		}
	}
}

// Request bodies: a whole small body is buffered before the upstream sees
// the request, with its length; a larger one streams after the buffer.
func TestBodyBuffering(t *testing.T) {
	var got []string
	var mu sync.Mutex
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, fmt.Sprintf("%d/%d", r.ContentLength, len(b)))
		mu.Unlock()
	})
	cfg, _ := ParseConfig("t", []byte("server: {buffer_body: 1024}\nrules:\n  - limits: [{requests: 100, per: 1s}]\n"))
	mw, err := New(cfg, up, Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	for _, n := range []int{10, 1024, 5000} {
		r := httptest.NewRequest("POST", "/", io.NopCloser(bytes.NewReader(make([]byte, n))))
		r.ContentLength = -1 // chunked
		mw.ServeHTTP(httptest.NewRecorder(), r)
	}
	if want := []string{"10/10", "1024/1024", "-1/5000"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("upstream saw length/bytes %v, want %v", got, want)
	}
}

// A refusal of an HTTP/2 request whose body was not read ends that stream
// alone (issue 46): Connection: close, which an HTTP/1 refusal needs, makes
// Go's HTTP/2 server send GOAWAY, and the next request, on the same
// connection, would have to open another. Both refusals that leave a body
// unread: a 429, and a 408 for a body that stalls past server.body_timeout.
func TestHTTP2RefusalKeepsConnection(t *testing.T) {
	cfg, err := ParseConfig("t", []byte("server: {body_timeout: 100ms}\nrules:\n  - key: [\"header:X-Key\"]\n    limits: [{requests: 1, per: 1m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.Copy(io.Discard, r.Body) })
	mw, err := New(cfg, up, Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	stalled, unstall := io.Pipe() // a body that never comes
	defer unstall.Close()
	testkit.PostsOnOneConnection(t, mw, []testkit.Post{
		{Name: "a POST", Key: "a", Want: 200},
		{Name: "a POST over its limit", Key: "a", Want: 429},
		{Name: "a POST of another key", Key: "b", Want: 200},
		{Name: "a POST whose body stalls", Key: "c", Body: stalled, Want: 408},
		{Name: "a POST of another key", Key: "d", Want: 200},
	})
	// HTTP/1 still closes: its unread body would hold the answer back.
	r := httptest.NewRequest("POST", "/", strings.NewReader("body"))
	r.Header.Set("X-Key", "a")
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r)
	if w.Code != 429 || w.Header().Get("Connection") != "close" {
		t.Errorf("an HTTP/1 POST over its limit: %d, Connection %q; want 429 and close", w.Code, w.Header().Get("Connection"))
	}
}

// codeKey sends one request with key as its X-Key.
func codeKey(mw *Middleware, key string) int {
	r := httptest.NewRequest("GET", "http://api.test/", nil)
	r.RemoteAddr = "198.51.100.1:1"
	r.Header.Set("X-Key", key)
	w := httptest.NewRecorder()
	mw.ServeHTTP(w, r)
	return w.Code
}

// A padded key part is judged as any other: counted under a digest of it
// (the same padding is the same key), and a per-client rule beside it
// still refuses the client at its limit, whatever each request pads.
func TestPaddedKeyPartJudgedAlone(t *testing.T) {
	h := newHarness(t, `rules:
  - name: per-client
    limits: [{requests: 3, per: 1m}]
  - name: per-key
    key: ["header:X-API-Key"]
    limits: [{requests: 2, per: 1m}]
`)
	pad := strings.Repeat("k", 5000)
	for i := range 2 {
		if w := h.req("192.0.2.7", "X-API-Key", pad); w.Code != 200 {
			t.Fatalf("request %d with a 5,000-byte key: %d", i+1, w.Code)
		}
	}
	if w := h.req("192.0.2.8", "X-API-Key", pad); w.Code != http.StatusTooManyRequests {
		t.Errorf("the same 5,000-byte key a third time (2 a minute): %d", w.Code)
	}
	// One client, a new padding each time: its per-client limit holds.
	admitted := 0
	for i := range 6 {
		if h.req("192.0.2.9", "X-API-Key", pad+strconv.Itoa(i)).Code == 200 {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("a client rotating 5,000-byte keys was admitted %d of 6, want its 3", admitted)
	}
}

// TestKeySpellings: spellings an application reads as one credential are
// one key (issue 46): the Authorization scheme in any case and with extra
// spaces; a query key as PHP reads it (api.key, api%20key) and before a
// ';'. Two spellings of the key parameter at once are refused with 400.
// Before, each spelling started a new key (or "-" for api_key=zed;x=1).
func TestKeySpellings(t *testing.T) {
	for _, tc := range []struct {
		name, key string
		first     func(*http.Request)
		others    []func(*http.Request)
	}{
		{"bearer", "header:Authorization", func(r *http.Request) { r.Header.Set("Authorization", "Bearer abc") }, []func(*http.Request){
			func(r *http.Request) { r.Header.Set("Authorization", "bearer abc") },
			func(r *http.Request) { r.Header.Set("Authorization", "BEARER abc") },
			func(r *http.Request) { r.Header.Set("Authorization", "Bearer  abc") },
			func(r *http.Request) { r.Header.Set("Authorization", "Bearer\tabc") },
		}},
		{"query", "query:api_key", func(r *http.Request) { r.URL.RawQuery = "api_key=zed" }, []func(*http.Request){
			func(r *http.Request) { r.URL.RawQuery = "api.key=zed" },
			func(r *http.Request) { r.URL.RawQuery = "api%20key=zed" },
			func(r *http.Request) { r.URL.RawQuery = "api_key=zed;x=1" },
			func(r *http.Request) { r.URL.RawQuery = "api[key=zed" },
			func(r *http.Request) { r.URL.RawQuery = "+api_key=zed" },
			func(r *http.Request) { r.URL.RawQuery = "%20api_key=zed" },
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, "rules:\n  - name: k\n    key: [\""+tc.key+"\"]\n    limits: [{requests: 1, per: 1h}]\n")
			do := func(set func(*http.Request)) int {
				r := httptest.NewRequest("GET", "/", nil)
				set(r)
				w := httptest.NewRecorder()
				h.mw.ServeHTTP(w, r)
				return w.Code
			}
			if c := do(tc.first); c != 200 {
				t.Fatalf("first: %d, want 200", c)
			}
			for i, set := range tc.others {
				if c := do(set); c != 429 {
					t.Errorf("spelling %d: %d, want 429 (the same key)", i+1, c)
				}
			}
		})
	}
	h := newHarness(t, "rules:\n  - name: k\n    key: [\"query:api_key\"]\n    limits: [{requests: 5, per: 1h}]\n")
	w := httptest.NewRecorder()
	h.mw.ServeHTTP(w, httptest.NewRequest("GET", "/?api_key=a&api.key=b", nil))
	if w.Code != 400 {
		t.Errorf("api_key and api.key at once: %d, want 400", w.Code)
	}
}
