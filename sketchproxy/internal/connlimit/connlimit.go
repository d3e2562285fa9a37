// Package connlimit caps a listener's connections, in all and per peer
// address, closing the excess as it is accepted: a client that opens
// connections and sends nothing (or only "PRI") can hold at most its
// share of the process's file descriptors, and never all of them, which
// would leave every other listener of the process unable to accept.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Limits are a Listener's caps; 0 is no cap.
type Limits struct {
	// Total caps the listener's open connections.
	Total int
	// PerPeer caps the open connections of one peer IP address (the
	// whole address: an IPv6 client's /64 is not grouped, as pods of one
	// node may share one).
	PerPeer int
}

// Reasons a connection is closed at accept, as Listener.OnRefuse names them.
const (
	ReasonTotal   = "total"
	ReasonPerPeer = "per_peer"
)

// Listener is a net.Listener whose Accept closes the connections past its
// Limits and returns the others; each returned connection holds its place
// until its first Close. It is safe for concurrent use and must not be
// copied; make one with New.
type Listener struct {
	net.Listener
	lim Limits
	// OnRefuse, if set before the first Accept, is called with each
	// connection closed at accept and why (ReasonTotal, ReasonPerPeer).
	OnRefuse func(peer netip.Addr, reason string)

	mu      sync.Mutex
	open    int
	peers   map[netip.Addr]int
	refused atomic.Uint64
}

// New wraps ln with the caps of lim.
func New(ln net.Listener, lim Limits) *Listener {
	return &Listener{Listener: ln, lim: lim, peers: map[netip.Addr]int{}}
}

// Accept returns the next connection within the caps; the others are
// closed as they come (counted in Refused), so that they never reach the
// server and hold a descriptor only for that moment.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer := peerOf(c)
		if reason := l.take(peer); reason != "" {
			c.Close()
			l.refused.Add(1)
			if l.OnRefuse != nil {
				l.OnRefuse(peer, reason)
			}
			continue
		}
		return &conn{Conn: c, l: l, peer: peer}, nil
	}
}

// take counts a new connection of peer, or says which cap refuses it.
func (l *Listener) take(peer netip.Addr) (reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.lim.Total > 0 && l.open >= l.lim.Total:
		return ReasonTotal
	case l.lim.PerPeer > 0 && peer.IsValid() && l.peers[peer] >= l.lim.PerPeer:
		return ReasonPerPeer
	}
	l.open++
	if peer.IsValid() {
		l.peers[peer]++
	}
	return ""
}

func (l *Listener) release(peer netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open--
	if peer.IsValid() {
		if l.peers[peer]--; l.peers[peer] <= 0 {
			delete(l.peers, peer)
		}
	}
}

// Open is how many accepted connections are open.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// Refused is how many connections Accept closed at once.
func (l *Listener) Refused() uint64 { return l.refused.Load() }

// peerOf is c's peer IP address; the zero Addr where it has none (a Unix
// socket), which only the total cap counts.
func peerOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

// conn gives its place back at its first Close.
type conn struct {
	net.Conn
	l    *Listener
	peer netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.peer) })
	return err
}
