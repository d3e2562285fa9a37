package connlimit_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/connlimit"
)

// dialFrom connects to addr from the loopback address from (127.0.0.0/8 is
// all the local host's on Linux), so that one machine plays several peers.
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedByServer reports whether the server closed c: a read gets EOF (or
// a reset) before the deadline.
func closedByServer(c net.Conn, within time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	return err != nil
}

// The caps hold for every order of arrival: a peer past its share and any
// connection past the total are closed at accept, the others are served,
// and a closed connection gives its place back.
func TestListenerCaps(t *testing.T) {
	for _, c := range []struct{ total, perPeer, peers, each int }{
		{total: 0, perPeer: 3, peers: 2, each: 5},
		{total: 4, perPeer: 0, peers: 2, each: 5},
		{total: 5, perPeer: 2, peers: 4, each: 3},
	} {
		t.Run(fmt.Sprintf("total=%d,per_peer=%d,peers=%d,each=%d", c.total, c.perPeer, c.peers, c.each), func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			why := map[string]int{}
			ln := connlimit.New(raw, connlimit.Limits{Total: c.total, PerPeer: c.perPeer})
			ln.OnRefuse = func(_ netip.Addr, reason string) { mu.Lock(); why[reason]++; mu.Unlock() }
			defer ln.Close()
			accepted := make(chan net.Conn, 64)
			go func() {
				for {
					s, err := ln.Accept()
					if err != nil {
						close(accepted)
						return
					}
					accepted <- s
				}
			}()
			var clients []net.Conn
			for p := range c.peers {
				for range c.each {
					clients = append(clients, dialFrom(t, fmt.Sprintf("127.0.0.%d", p+2), raw.Addr().String()))
				}
			}
			// Accept has seen every connection once each is counted; the
			// refused ones are closed by then, their FIN already here.
			for deadline := time.Now().Add(10 * time.Second); ln.Open()+int(ln.Refused()) < len(clients); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("Accept saw %d of %d connections", ln.Open()+int(ln.Refused()), len(clients))
				}
			}
			open := 0
			for _, cl := range clients {
				if !closedByServer(cl, 50*time.Millisecond) {
					open++
				}
			}
			want := c.peers * c.each
			if c.perPeer > 0 {
				want = c.peers * min(c.each, c.perPeer)
			}
			if c.total > 0 {
				want = min(want, c.total)
			}
			if open != want || ln.Open() != want || int(ln.Refused()) != len(clients)-want {
				t.Fatalf("%d of %d connections left open (Open %d, Refused %d), want %d", open, len(clients), ln.Open(), ln.Refused(), want)
			}
			mu.Lock()
			if why[connlimit.ReasonTotal]+why[connlimit.ReasonPerPeer] != len(clients)-want {
				t.Errorf("OnRefuse told %v, want %d refusals", why, len(clients)-want)
			}
			mu.Unlock()
			// Every accepted connection closed by the server gives its place
			// back: the same peers get them all again.
			for range want {
				s := <-accepted
				s.Close()
				s.Close() // twice: one place given back
			}
			if n := ln.Open(); n != 0 {
				t.Fatalf("%d places held after every connection closed", n)
			}
			again := dialFrom(t, "127.0.0.2", raw.Addr().String())
			s := <-accepted
			io.WriteString(s, "x")
			if closedByServer(again, 2*time.Second) {
				t.Error("a new connection refused after every place was given back")
			}
		})
	}
}
