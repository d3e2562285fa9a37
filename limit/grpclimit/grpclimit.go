// Package grpclimit limits gRPC calls per client with a [limit.Limiter]: it
// implements the Limiter interface of go-grpc-middleware v2's ratelimit
// interceptors, keyed by the client's address (PeerIP, or ClientIP behind
// proxies you trust) or by a metadata value, and refuses with
// codes.ResourceExhausted.
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
	"fmt"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/limit/clientip"
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
// names through l. PeerIP, ClientIP and Metadata make key functions. New
// panics if l or key is nil, as limit.Middleware does: a Limiter without
// them would panic at its first call instead.
func New(l *limit.Limiter, key func(ctx context.Context) string) *Limiter {
	if l == nil || key == nil {
		panic("grpclimit: New needs a limit.Limiter and a key function: got a nil one")
	}
	return &Limiter{l: l, key: key}
}

// Limit admits the call of ctx, or refuses it with an error of code
// ResourceExhausted (status.Code reads it) that says when to retry; then,
// on a server, it also sets the trailer retry-after, in whole seconds.
// go-grpc-middleware's interceptors put their own words before the
// message ("/pkg.Svc/Method is rejected by grpc_ratelimit middleware,
// please retry later. rate limit exceeded: retry after 45 s"); the code and
// the trailer are what a client should read.
func (g *Limiter) Limit(ctx context.Context) error {
	d := g.l.Decide(time.Time{}, g.key(ctx), 1)
	if d.Allowed {
		return nil
	}
	secs := rate.Seconds(d.RetryAfter) // whole seconds, at least 1, as Retry-After

	// On a client's context there is no server stream: nothing to set.
	_ = grpc.SetTrailer(ctx, metadata.Pairs("retry-after", strconv.FormatInt(secs, 10)))
	return refusal(secs)
}

// refusal is Limit's error: the seconds to wait. Its message is bare
// (the interceptors wrap it in a ResourceExhausted status of their own,
// and a status error's message would read "rpc error: code = ... desc =
// ..." inside theirs); GRPCStatus gives its code to a caller that returns
// it itself.
type refusal int64

func (r refusal) Error() string {
	return fmt.Sprintf("rate limit exceeded: retry after %d s", int64(r))
}

// GRPCStatus is the refusal as a status of code ResourceExhausted.
func (r refusal) GRPCStatus() *status.Status {
	return status.New(codes.ResourceExhausted, r.Error())
}

// PeerIP is the address of the call's peer without its port, "" when ctx
// has none: an IPv4 address whole, an IPv6 address as its /64
// ("2001:db8:1:2::/64"), which one subscriber or host usually holds whole,
// so that a client cannot rotate through its prefix to multiply its limit
// (limit.ClientIP with limit.IPv6Prefix(64), and SketchProxy's default,
// group it alike). A peer that is not an IP address (a Unix socket) is its
// address as it is. Behind a proxy the peer is the proxy: key by ClientIP
// with the proxies you trust instead.
func PeerIP(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	s := p.Addr.String()
	a := clientip.ParseAddr(s)
	if !a.IsValid() {
		return s
	}
	return clientip.Key(a, 32, 64)
}

// ClientIP returns a key function for the client's address as the proxies
// you trust saw it, read as limit.ClientIP reads an HTTP request: the
// peer is the client unless it is a trusted proxy (limit.TrustProxies);
// then the metadata x-forwarded-for (or forwarded, with
// limit.FromForwarded) is read from the right, past trusted proxies, and
// the first untrusted address is the client. What lies left of it was
// written by the client and is never believed. IPv6 addresses are grouped
// by /64 as PeerIP groups them, unless an option says otherwise
// (limit.IPv6Prefix(128) keys each address). Without TrustProxies it is
// PeerIP. It returns limit.ClientIP's error for an option it cannot use.
func ClientIP(opts ...limit.IPOption) (func(context.Context) string, error) {
	key, err := limit.ClientIP(append([]limit.IPOption{limit.IPv6Prefix(64)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) string {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return ""
		}
		r := &http.Request{RemoteAddr: p.Addr.String(), Header: http.Header{}}
		md, _ := metadata.FromIncomingContext(ctx)
		for _, name := range [...]string{"X-Forwarded-For", "Forwarded"} {
			if vs := md.Get(name); len(vs) > 0 {
				r.Header[name] = vs
			}
		}
		return key(r)
	}, nil
}

// Metadata returns a key function for the first value of the incoming
// metadata name (an API key, a tenant), case-insensitive as gRPC metadata
// is. Calls without it share the key "". The client sends its metadata:
// a value it may choose freely (x-forwarded-for, x-real-ip) makes a new
// key for each call; key addresses by ClientIP.
func Metadata(name string) func(context.Context) string {
	return func(ctx context.Context) string {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 {
			return v[0]
		}
		return ""
	}
}
