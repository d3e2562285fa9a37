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
	"google.golang.org/grpc/status"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/limit/grpclimit"
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
// retry-after, the seconds to the next minute (two halvings of the count,
// at :30 and :00).
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
	if got := trailer.Get("retry-after"); len(got) != 1 || got[0] != "45" {
		t.Fatalf("retry-after trailer %q, want 45", got)
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

// TestLongestWait: a wait as long as a time.Duration holds (a new key
// refused, by OverflowRefuse, in a bucket full of keys at a limit of 1
// per 292 years with a Burst of 2) says 292 years, in the seconds that
// package rate rounds, not 1 s.
func TestLongestWait(t *testing.T) {
	clk := epochsketch.NewManualClock(time.Unix(1_800_000_015, 0))
	l := limit.NewWith(limit.Config{Requests: 1, Per: 292 * 365 * 24 * time.Hour, Burst: 2, NumBuckets: 1, Overflow: limit.OverflowRefuse, Clock: clk, Seed: 1})
	t.Cleanup(func() { l.Close() })
	for i := range 8 {
		l.AllowN(time.Time{}, fmt.Sprint("full-", i), 2)
	}
	g := grpclimit.New(l, func(context.Context) string { return "new" })
	err := g.Limit(context.Background())
	if status.Code(err) != codes.ResourceExhausted || !strings.HasSuffix(err.Error(), "retry after 9223372037 s") {
		t.Fatalf("%v, want ResourceExhausted, retry after 9223372037 s", err)
	}
}
