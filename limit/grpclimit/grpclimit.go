// Package grpclimit limits gRPC calls per client with a [limit.Limiter]: it
// implements the Limiter interface of go-grpc-middleware v2's ratelimit
// interceptors, keyed by the peer's address or by a metadata value, and
// refuses with codes.ResourceExhausted.
//
//	l := grpclimit.New(limit.New(100, time.Second), grpclimit.PeerIP)
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(ratelimit.UnaryServerInterceptor(l)),
//		grpc.ChainStreamInterceptor(ratelimit.StreamServerInterceptor(l)),
//	)
//
// A refusal also sets the trailer retry-after to the seconds until the call
// would be admitted. It is a module of its own so that package limit, like
// the rest of EpochSketch, keeps no dependency outside the standard library.
// Neither module is published yet: a program uses both from a clone, with
// a replace line for each in its go.mod (the replace in grpclimit's own
// go.mod applies only inside this repository):
//
//	require (
//		github.com/epochsketch/epochsketch v0.0.0
//		github.com/epochsketch/epochsketch/limit/grpclimit v0.0.0
//	)
//	replace (
//		github.com/epochsketch/epochsketch => ../epochsketch
//		github.com/epochsketch/epochsketch/limit/grpclimit => ../epochsketch/limit/grpclimit
//	)
package grpclimit

import (
	"context"
	"net"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/rate"
)

// Limiter admits each client's calls at the rate of a limit.Limiter. It
// implements ratelimit.Limiter of
// github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit.
// It is safe for concurrent use.
type Limiter struct {
	l   *limit.Limiter
	key func(context.Context) string
}

// New returns a Limiter that admits each call of the client key(ctx)
// names through l. PeerIP and Metadata make key functions.
func New(l *limit.Limiter, key func(ctx context.Context) string) *Limiter {
	return &Limiter{l: l, key: key}
}

// Limit admits the call of ctx, or refuses it with a status error of code
// ResourceExhausted that says when to retry; then, on a server, it also
// sets the trailer retry-after, in whole seconds. go-grpc-middleware's
// interceptors put their own words before this message ("... is rejected by
// grpc_ratelimit middleware, please retry later. rpc error: ..."); the code
// and the trailer are what a client should read.
func (g *Limiter) Limit(ctx context.Context) error {
	d := g.l.Decide(time.Time{}, g.key(ctx), 1)
	if d.Allowed {
		return nil
	}
	secs := rate.Seconds(d.RetryAfter) // whole seconds, at least 1, as Retry-After

	// On a client's context there is no server stream: nothing to set.
	_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", strconv.FormatInt(secs, 10)))
	return status.Errorf(codes.ResourceExhausted, "rate limit exceeded: retry after %d s", secs)
}

// PeerIP is the address of the call's peer without its port, "" when ctx
// has none. Behind a proxy it is the proxy's address: key by a metadata
// value the proxy sets instead (Metadata).
func PeerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	s := p.Addr.String()
	if host, _, err := net.SplitHostPort(s); err == nil {
		return host
	}
	return s
}

// Metadata returns a key function for the first value of the incoming
// metadata name (an API key, a tenant), case-insensitive as gRPC metadata
// is. Calls without it share the key "".
func Metadata(name string) func(context.Context) string {
	return func(ctx context.Context) string {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 {
			return v[0]
		}
		return ""
	}
}
