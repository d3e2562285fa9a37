package sketchproxy

import (
	"fmt"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Requests held open by invented keys and client addresses leave every
// fresh key and client its places: 512 real connections, each a POST of
// Content-Length 100 that sent 1 byte under a key and an address of its
// own, hold max_in_flight and max_in_flight_per_client (1 each), and then
// 500 fresh keys from fresh addresses asking once are all admitted, while
// a held key, and a held address, asking for one more are refused. In the
// count-min table the counts were kept in (2 × 4,096 cells), about 14 of
// the 500 were refused in_flight (issue 46; 8,192 keys holding 2 each
// refused 3 in 4: TestInFlightInventedKeysCannotFill in internal/engine).
func TestInFlightHeldConnections(t *testing.T) {
	const held, fresh = 512, 500
	h := newHarness(t, `server: {max_in_flight_per_client: 1}
client_ip: {trusted_proxies: [127.0.0.1], source: x-forwarded-for, ipv4_prefix: 32}
rules:
  - name: api
    key: ["header:X-API-Key"]
    max_in_flight: 1
`)
	srv := httptest.NewServer(h.mw)
	defer srv.Close()
	for i := range held {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Admitted, the request waits for the 99 bytes that never come
		// (body_timeout is 30 s), until its client goes.
		fmt.Fprintf(c, "POST /v1/x HTTP/1.1\r\nHost: api.test\r\nX-API-Key: invented-%d\r\nX-Forwarded-For: %s\r\nContent-Length: 100\r\n\r\nA",
			i, heldAddr(i))
	}
	counts := h.mw.state.Load().rules[0].eng.Counts
	decided := func() uint64 {
		return counts.Get(engine.Allow, false) + counts.Get(engine.InFlight, false) + h.mw.met.clientCap.Load()
	}
	for deadline := time.Now().Add(20 * time.Second); decided() < held; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d held requests decided in 20 s", decided(), held)
		}
	}
	if n := counts.Get(engine.Allow, false); n != held {
		t.Errorf("%d of %d invented keys, each asking once from an address of its own, admitted", n, held)
	}
	refused := 0
	for i := range fresh {
		w := h.req(fmt.Sprintf("198.18.%d.%d", i/256, i%256), "X-API-Key", fmt.Sprint("fresh-", i))
		if w.Code != 200 {
			refused++
		}
	}
	if refused > 0 {
		t.Errorf("%d keys and addresses holding a request each: %d of %d fresh ones asking once refused, want 0", held, refused, fresh)
	}
	if w := h.req("198.18.255.1", "X-API-Key", "invented-7"); w.Code != 429 || decodeProblem(t, w).Outcome != "in_flight" {
		t.Errorf("a held key asking for a second place: %d %s, want 429 in_flight", w.Code, w.Body.String())
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", "http://api.test/v1/x", nil)
	r.RemoteAddr = "127.0.0.1:1234"
	r.Header.Set("X-Forwarded-For", heldAddr(7))
	r.Header.Set("X-API-Key", "fresh-from-a-held-address")
	if h.mw.ServeHTTP(w, r); w.Code != 429 {
		t.Errorf("a held address asking for a second place: %d %s, want 429", w.Code, w.Body.String())
	}
}

// heldAddr is the client address of TestInFlightHeldConnections' held
// request i.
func heldAddr(i int) string { return fmt.Sprintf("10.%d.%d.1", i/256, i%256) }
