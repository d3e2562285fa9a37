// Package testkit holds helpers that the tests of several SketchProxy
// packages share (the proxy's, the engine's, the Caddy module's). Only tests
// import it.
package testkit

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// MaxInWindow is the most of the sorted instants ts within any window
// [s, s+w): what the window bound (package rate) caps.
func MaxInWindow(ts []time.Duration, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return best
}

// Post is one request of PostsOnOneConnection: a POST with the header
// X-Key: Key and Body ("body" if nil), answered Want.
type Post struct {
	Name, Key string
	Body      io.Reader
	Want      int
}

// PostsOnOneConnection serves h over HTTP/2 with TLS, sends posts in turn
// through one client, and fails t unless each is answered over HTTP/2 with
// its status on the one connection the first opened: a refusal that sent
// Connection: close would make Go's HTTP/2 server send GOAWAY.
func PostsOnOneConnection(t testing.TB, h http.Handler, posts []Post) {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	for i, p := range posts {
		body := p.Body
		if body == nil {
			body = strings.NewReader("body")
		}
		r, _ := http.NewRequest("POST", srv.URL+"/", body)
		r.Header.Set("X-Key", p.Key)
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatalf("%s: %v", p.Name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != p.Want || resp.ProtoMajor != 2 {
			t.Errorf("%s: %s %d, want HTTP/2 %d", p.Name, resp.Proto, resp.StatusCode, p.Want)
		}
		if n := conns.Load(); n != 1 {
			t.Fatalf("%s: %d connections after %d requests, want the first one alone", p.Name, n, i+1)
		}
	}
}
