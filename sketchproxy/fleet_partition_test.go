package sketchproxy

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/testkit"
)

// cutProxy forwards TCP connections to a redis-server until cut; then it
// is a black hole, as a network partition is: what a client sends is
// read and dropped, nothing comes back, and new connections are taken
// and do the same. Connections cut are never forwarded again.
type cutProxy struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	cut  bool
	open []net.Conn
}

func newCutProxy(t *testing.T, to string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, to: to}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.open {
			c.Close()
		}
		p.mu.Unlock()
	})
	go p.serve()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.open = append(p.open, c)
		cut := p.cut
		p.mu.Unlock()
		if cut {
			go io.Copy(io.Discard, c)
			continue
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.open = append(p.open, up)
		p.mu.Unlock()
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// pipe copies src to dst until the proxy is cut; from then on it drops
// what src sends.
func (p *cutProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if !cut {
			dst.Write(buf[:n])
		}
	}
}

func (p *cutProxy) setCut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
}

// One of 3 replicas cut off from Redis (a partition: its packets
// dropped) while the other two reach it. From inside, the cut-off
// replica cannot tell the cut from an outage, where θ/N each is right,
// and decides alone at θ/N; the other two cannot tell it from a crash,
// after which holding its room would refuse clients under their limit,
// and share the limit between them. So while the cut lasts the fleet
// admits up to θ/N more than the bound in a tick, and up to 1 + 1/N
// times the limit over many: the one exception docs/fleets.md gives
// for a partition. This measures it, holds it to that, and holds that a
// client under its limit is never refused.
func TestFleetProcessReplicaCutOff(t *testing.T) {
	for _, c := range []struct {
		name  string
		l     procLimit
		sends int           // requests of the heavy key, round robin
		every time.Duration // between them
		tick  bool          // the window in one tick of the limit
	}{
		{"one tick", procLimit{requests: 20, per: time.Minute, burst: 20}, 150, 30 * time.Millisecond, true},
		{"many ticks", procLimit{requests: 10, per: time.Second, burst: 10}, 240, 25 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := c.l
			addr := testkit.RedisServer(t)
			proxy := newCutProxy(t, addr)
			ls := []*Limiter{procReplica(t, l, FleetConfig{Redis: proxy.addr(), ID: "r0"}, "")}
			for i := 1; i < 3; i++ {
				ls = append(ls, procReplica(t, l, FleetConfig{Redis: addr, ID: fmt.Sprint("r", i)}, ""))
			}
			waitMembers(t, ls, 3)
			pastWarmUp(ls)
			if c.tick {
				procTick(t, l, 8*time.Second)
			}
			proxy.setCut()
			for deadline := time.Now().Add(5 * time.Second); ls[0].mw.fleet.Stats().Up; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the replica cut off from Redis still reckons Redis up after 5 s")
				}
			}
			if n := ls[0].mw.fleet.Stats().Replicas; n != 3 {
				t.Fatalf("the replica cut off counts %d replicas, want 3 (the most seen lately)", n)
			}
			var heavy, light procRun
			var each [3]int
			for i := range c.sends {
				before := heavy.admitted
				heavy.send(ls[i%3], "heavy")
				each[i%3] += heavy.admitted - before
				if i%25 == 0 {
					light.send(ls[i/25%3], "light")
				}
				time.Sleep(c.every)
			}
			w := heavy.last.Sub(heavy.first)
			share := int(l.burst / 3) // θ/N of one replica, whole requests
			slack := share
			if !c.tick {
				// 1/N of the limit more over the window, and the cut
				// replica's θ/N.
				slack = int(l.requests*float64(w)/float64(l.per)/3) + share
			}
			t.Logf("one of 3 replicas cut off for %v: the fleet admitted %d (the cut one %d, the others %d and %d); the bound %d, plus %d for the cut",
				w.Round(time.Millisecond), heavy.admitted, each[0], each[1], each[2], l.bound(w), slack)
			heavy.check(t, l, light, slack)
		})
	}
}
