package sketchproxy

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

// Envoy's rate-limit service is package internal/rls; this file hands it
// the running configuration and keeps the API programs call.

// RegisterRateLimitService registers Envoy's rate-limit service, answered
// from the envoy_rls domains of the running config, and the standard gRPC
// health service on s.
func (m *Middleware) RegisterRateLimitService(s *grpc.Server) {
	m.RegisterRateLimitServiceWithHealth(s)
}

// RegisterRateLimitServiceWithHealth registers Envoy's rate-limit service
// and the standard gRPC health service on s, as RegisterRateLimitService
// does, and returns the health service. Both the server ("") and
// envoy.service.ratelimit.v3.RateLimitService report SERVING until the
// program calls its Shutdown, as it starts draining: from then on both
// report NOT_SERVING, to Check and to Watch, while calls are still
// answered.
func (m *Middleware) RegisterRateLimitServiceWithHealth(s *grpc.Server) *health.Server {
	return rls.Register(s, m.rlsService())
}

// RateLimitServerOptions are the gRPC server options that Envoy's
// rate-limit service needs beside RegisterRateLimitService: a codec that
// reads a RateLimitRequest whose entries are not valid UTF-8. Proto3
// refuses such a message whole, so the call fails, and Envoy lets a request
// through when its rate-limit service fails (failure_mode_deny is false by
// default): a client that puts one invalid byte in a header would skip
// every limit of the request. With this codec such a value is judged by its
// bytes, as any other, and every other descriptor is decided as usual. A
// call is capped at 4 MiB, gRPC's default. cmd/sketchproxy uses them; a
// program that serves the service on its own grpc.Server passes these
// options to grpc.NewServer.
func RateLimitServerOptions() []grpc.ServerOption { return rls.ServerOptions() }

// rlsService is Envoy's rate-limit service over m.
func (m *Middleware) rlsService() *rls.Service {
	return rls.New((*rlsHost)(m), m.eng, &m.met.rls)
}

// rlsHost is the Middleware as Envoy's service sees it (rls.Host).
type rlsHost Middleware

func (h *rlsHost) Snapshot() rls.Snapshot {
	st := (*Middleware)(h).state.Load()
	return rls.Snapshot{Config: st.cfg.EnvoyRLS, RLS: st.b.RLS(), Set: st.set, Latency: st.rlsLatency}
}

func (h *rlsHost) Now() time.Time { return (*Middleware)(h).now() }

func (h *rlsHost) LogVerdict(v *engine.Verdict, shadow, never bool, door ...any) {
	(*Middleware)(h).logVerdict(v, shadow, never, door...)
}

func (h *rlsHost) Label(key string) string { return (*Middleware)(h).display(key) }

// GRPCTLS is the TLS of envoy_rls's gRPC listener: the server certificate
// and, for mutual TLS, the client CAs, from envoy_rls.tls's files. Reload
// reads them again; new connections get what was last loaded.
type GRPCTLS struct{ t *rls.TLS }

// NewGRPCTLS loads cfg's envoy_rls.tls; it returns nil without one.
func NewGRPCTLS(cfg *Config) (*GRPCTLS, error) {
	t, err := rls.LoadTLS(cfg)
	if t == nil || err != nil {
		return nil, err
	}
	return &GRPCTLS{t}, nil
}

// Credentials are the gRPC server's transport credentials: each handshake
// uses the configuration loaded last.
func (g *GRPCTLS) Credentials() credentials.TransportCredentials { return g.t.Credentials() }

// Reload reads the files again. If what they hold changed and loads, new
// connections use it: changed is true. If it does not load, err says why,
// the running configuration stays, and the same broken files are not
// reported again. Connections already open keep their handshake.
func (g *GRPCTLS) Reload() (changed bool, err error) { return g.t.Reload() }
