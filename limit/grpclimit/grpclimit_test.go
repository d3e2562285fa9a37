package grpclimit_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/limit/grpclimit"
	"github.com/epochsketch/epochsketch/rate"
)

var _ ratelimit.Limiter = (*grpclimit.Limiter)(nil)

// serve starts a real gRPC server (the health service) on a free loopback
// port behind go-grpc-middleware's ratelimit interceptors with g, and
// returns a client for it.
func serve(t *testing.T, g *grpclimit.Limiter) healthpb.HealthClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(g)),
		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(g)),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// newLimiter is requests per minute, with the default Burst (Requests:
// ticks of 30 s), on a ManualClock 15 s into a minute.
func newLimiter(t *testing.T, requests int) *limit.Limiter {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_015, 0))
	l := limit.NewWith(limit.Config{Requests: requests, Per: time.Minute, Clock: clk, Seed: 1})
	t.Cleanup(func() { l.Close() })
	return l
}

// TestPeerIP: the burst of 1 per minute passes, the next unary call and
// the next stream are refused with ResourceExhausted and the trailer
// retry-after, the seconds until the count leaves room (a tick, 37.2 s,
// from the start of the step the first call counted in).
func TestPeerIP(t *testing.T) {
	c := serve(t, grpclimit.New(newLimiter(t, 1), grpclimit.PeerIP))
	ctx := context.Background()
	for i := range 1 {
		if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
	var trailer metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("call 2: %v, want ResourceExhausted", err)
	}
	if got := trailer.Get("retry-after"); len(got) != 1 || got[0] != "37" {
		t.Fatalf("retry-after trailer %q, want 37 (a tick of 37.2 s)", got)
	}
	st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream: %v, want ResourceExhausted", err)
	}
}

// TestMetadata: clients keyed by an API key in metadata have their own
// limits over one connection.
func TestMetadata(t *testing.T) {
	c := serve(t, grpclimit.New(newLimiter(t, 2), grpclimit.Metadata("X-API-Key")))
	call := func(key string) error {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
		_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for i := range 2 { // the Burst of 2 a minute
		if err := call("a"); err != nil {
			t.Fatalf("key a, call %d: %v", i+1, err)
		}
	}
	if err := call("a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("key a, call 3: %v, want ResourceExhausted", err)
	}
	if err := call("b"); err != nil {
		t.Fatalf("key b: %v", err)
	}
	if got := grpclimit.Metadata("x-api-key")(context.Background()); got != "" {
		t.Fatalf("no metadata: %q, want \"\"", got)
	}
	if got := grpclimit.PeerIP(context.Background()); got != "" {
		t.Fatalf("no peer: %q, want \"\"", got)
	}
}

// TestLongestWait: a wait of centuries (a new key refused, by
// OverflowRefuse, in a bucket full of keys at a limit of 1 per 292 years)
// is said in the seconds that package rate rounds, not 1 s.
func TestLongestWait(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_015, 0))
	l := limit.NewWith(limit.Config{Requests: 1, Per: 292 * 365 * 24 * time.Hour, Burst: 1, NumBuckets: 1, Overflow: limit.OverflowRefuse, Clock: clk, Seed: 1})
	t.Cleanup(func() { l.Close() })
	for i := range 8 {
		l.AllowN(time.Time{}, fmt.Sprint("full-", i), 1)
	}
	d := l.Decide(time.Time{}, "new", 1)
	if d.Allowed || d.RetryAfter < 100*365*24*time.Hour {
		t.Fatalf("a new key in a full bucket: %+v, want a refusal for centuries", d)
	}
	want := fmt.Sprintf("retry after %d s", rate.Seconds(d.RetryAfter))
	g := grpclimit.New(l, func(context.Context) string { return "new" })
	err := g.Limit(context.Background())
	if status.Code(err) != codes.ResourceExhausted || !strings.HasSuffix(err.Error(), want) {
		t.Fatalf("%v, want ResourceExhausted, %s", err, want)
	}
}

// TestNewNil: a nil Limiter or key function panics at New, saying so,
// not at the first call.
func TestNewNil(t *testing.T) {
	l := newLimiter(t, 1)
	for name, mk := range map[string]func(){
		"nil-limiter": func() { grpclimit.New(nil, grpclimit.PeerIP) },
		"nil-key":     func() { grpclimit.New(l, nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, "grpclimit: New needs") {
					t.Fatalf("panic %q, want grpclimit: New needs ...", msg)
				}
			}()
			mk()
		})
	}
}

// peerCtx is an incoming call's context from addr with metadata pairs.
func peerCtx(addr string, kv ...string) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: addrOf(addr)})
	return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
}

type addrOf string

func (a addrOf) Network() string { return "tcp" }
func (a addrOf) String() string  { return string(a) }

// TestPeerIPGroups: IPv6 peers of one /64 are one key, as limit.ClientIP
// with IPv6Prefix(64) keys them; IPv4 and IPv4-mapped peers stay whole.
func TestPeerIPGroups(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.7:5000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:5000", "192.0.2.7"},
		{"[2001:db8:1:2::1]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::9%eth0]:5000", "2001:db8:1:2::/64"},
		{"@", "@"},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			if got := grpclimit.PeerIP(peerCtx(tc.addr)); got != tc.want {
				t.Fatalf("PeerIP = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestClientIP: behind a trusted proxy the right-most untrusted address
// of x-forwarded-for is the key, whatever the client wrote left of it;
// from an untrusted peer the metadata is ignored.
func TestClientIP(t *testing.T) {
	key, err := grpclimit.ClientIP(limit.TrustProxies("10.0.0.0/8"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer, xff, want string
	}{
		{"trusted", "10.0.0.1:1", "198.51.100.9", "198.51.100.9"},
		{"spoofed-left", "10.0.0.1:1", "1.2.3.4, 198.51.100.9", "198.51.100.9"},
		{"two-hops", "10.0.0.1:1", "198.51.100.9, 10.0.0.2", "198.51.100.9"},
		{"v6-by-64", "10.0.0.1:1", "2001:db8:1:2::77", "2001:db8:1:2::/64"},
		{"untrusted-peer", "203.0.113.5:1", "1.2.3.4", "203.0.113.5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := key(peerCtx(tc.peer, "x-forwarded-for", tc.xff)); got != tc.want {
				t.Fatalf("key = %q, want %q", got, tc.want)
			}
		})
	}
	if _, err := grpclimit.ClientIP(limit.TrustProxies("nope")); err == nil {
		t.Fatal("TrustProxies(nope): no error")
	}
}

// TestRefusalMessage: through the interceptors the message carries the
// wait once, not a status error's "rpc error: code = ... desc =" inside
// theirs; called directly, the error still has code ResourceExhausted.
func TestRefusalMessage(t *testing.T) {
	g := grpclimit.New(newLimiter(t, 1), func(context.Context) string { return "k" })
	c := serve(t, g)
	c.Check(context.Background(), &healthpb.HealthCheckRequest{})
	_, err := c.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("%v, want ResourceExhausted", err)
	}
	msg := status.Convert(err).Message()
	if strings.Count(msg, "rpc error") != 0 || strings.Count(msg, "retry after") != 1 {
		t.Fatalf("message %q: want one \"retry after\" and no nested \"rpc error\"", msg)
	}
	if err := g.Limit(context.Background()); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Limit: %v, want ResourceExhausted", err)
	}
}
