// Package rls is Envoy's rate-limit service (envoy.service.ratelimit.v3)
// over the decision engine, kept apart as envoyproxy/ratelimit keeps its
// config, limiter and service: package config holds envoy_rls's types and
// compiles its domains into descriptor trees, internal/engine decides, and
// this package only translates: each descriptor to a fact (the node of its
// domain's tree it leads to and its key), the decision to one status per
// descriptor and the response's headers and metadata. What it needs of the
// program it runs in (the running configuration, the clock, the refusal
// log and the key labels) a [Host] hands it; it never imports sketchproxy.
package rls

import (
	"context"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Snapshot is one configuration as the service reads it: the running one
// at the call's start, swapped whole on reload.
type Snapshot struct {
	Config  *config.EnvoyRLSConfig // envoy_rls (nil: off; every domain is unknown)
	RLS     *config.RLS            // its domains' descriptor trees
	Set     *engine.Set            // the rule set the engine decides with
	Latency []prometheus.Observer  // the latency histograms of Set.RLSRules, in order
}

// Host is what the service needs of the program it runs in.
type Host interface {
	// Snapshot is the running configuration.
	Snapshot() Snapshot
	// Now is the decisions' clock.
	Now() time.Time
	// LogVerdict logs a refusal (or a shadow one) as every door's are,
	// with the door's own attributes.
	LogVerdict(v *engine.Verdict, shadow, never bool, door ...any)
	// Label is a key as logs and metrics show it (a keyed hash).
	Label(key string) string
}

// Service answers Envoy's ShouldRateLimit calls from the envoy_rls domains
// of its Host's running configuration, deciding with eng and counting in
// met. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	host Host
	eng  *engine.Engine
	met  *Metrics
}

// New is the service of host's configuration, deciding with eng.
func New(host Host, eng *engine.Engine, met *Metrics) *Service {
	return &Service{host: host, eng: eng, met: met}
}

// Register registers s and the standard gRPC health service on gs, and
// returns the health service. Both the server ("") and
// envoy.service.ratelimit.v3.RateLimitService report SERVING until the
// program sets them NOT_SERVING, as it starts draining.
func Register(gs *grpc.Server, s *Service) *health.Server {
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, h)
	return h
}

// ShouldRateLimit answers Envoy: it matches every descriptor against the
// domain's tree as envoyproxy/ratelimit does (the limit of the node the
// whole descriptor leads to, unless another matched descriptor's limit
// replaces it; none: OK), hands the matched ones to the engine as one
// request's facts, and translates its decision into one status per
// descriptor and the response's headers. Each descriptor is judged on its
// own: one that is oversized, malformed or unknown never turns the call
// into an error (Envoy would let the whole request through), it only finds
// no limit, or is counted under a digest of its value (engine.MaxKey).
// Unknown domains are OK: the limiter fails open.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	begin := time.Now() // the latency histogram's clock, as the HTTP doors'
	st := s.host.Snapshot()
	now := s.host.Now()
	s.met.Requests.Add(1)
	if err := checkCall(ctx, req); err != nil {
		return nil, err
	}
	root := st.RLS.Domain(req.GetDomain())
	if root == nil {
		s.met.UnknownDomain.Add(1)
	}
	rc := st.Config
	if rc == nil {
		rc = &off
	}
	var mroom [8]match
	var froom [8]engine.Fact
	ms := matchDescriptors(root, req, mroom[:0])
	facts := factsOf(st.Set, ms, froom[:0])
	sc := scratchPool.Get().(*engine.Scratch)
	defer func() { sc.Reset(); scratchPool.Put(sc) }()
	d := s.eng.Decide(ctx, st.Set, now, &engine.Request{Facts: facts, NoDrip: true, Shadow: rc.ShadowMode}, sc)
	defer d.Done()
	resp := respond(req, ms, &d, rc, now)
	if !d.Admitted {
		s.met.OverLimit.Add(1)
	}
	s.observe(req.GetDomain(), ms, &d)
	observeLatency(st.Latency, ms, time.Since(begin).Seconds())
	return resp, nil
}

// checkCall refuses a call no descriptor of which can be judged: its
// caller has gone, or it names no domain or no descriptor.
func checkCall(ctx context.Context, req *rlsv3.RateLimitRequest) error {
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	if req.GetDomain() == "" {
		return status.Error(codes.InvalidArgument, "domain is empty: Envoy's ratelimit filter must name one")
	}
	if len(req.GetDescriptors()) == 0 {
		return status.Error(codes.InvalidArgument, "no descriptors")
	}
	return nil
}

// off is envoy_rls as a Middleware without it reads: the program
// registered the service, but no domain is configured, so every call is
// answered OK.
var off config.EnvoyRLSConfig

// scratchPool holds the engine's per-call buffers.
var scratchPool = sync.Pool{New: func() any { return new(engine.Scratch) }}
