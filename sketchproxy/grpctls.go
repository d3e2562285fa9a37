package sketchproxy

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// GRPCTLS is the TLS of envoy_rls's gRPC listener: the server certificate
// and, for mutual TLS, the client CAs, from envoy_rls.tls's files. Reload
// reads them again; new connections get what was last loaded.
type GRPCTLS struct {
	files config.GRPCTLSFiles
	cur   atomic.Pointer[tls.Config]

	mu   sync.Mutex // one Reload at a time
	seen string     // the digest of the files at the last Reload, loaded or not
}

// NewGRPCTLS loads cfg's envoy_rls.tls; it returns nil without one.
func NewGRPCTLS(cfg *Config) (*GRPCTLS, error) {
	files, tc, digest, err := config.LoadGRPCTLS(cfg)
	if tc == nil || err != nil {
		return nil, err
	}
	g := &GRPCTLS{files: files}
	g.cur.Store(tc)
	g.seen = digest
	return g, nil
}

// Credentials are the gRPC server's transport credentials: each handshake
// uses the configuration loaded last.
func (g *GRPCTLS) Credentials() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return g.cur.Load(), nil
		},
	})
}

// Reload reads the files again. If what they hold changed and loads, new
// connections use it: changed is true. If it does not load, err says why,
// the running configuration stays, and the same broken files are not
// reported again. Connections already open keep their handshake.
func (g *GRPCTLS) Reload() (changed bool, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	tc, digest, field, err := g.files.Load()
	if digest == g.seen {
		return false, nil
	}
	g.seen = digest
	if err != nil {
		return false, fmt.Errorf("envoy_rls.tls.%s: %v", field, err)
	}
	g.cur.Store(tc)
	return true, nil
}

// RegisterRateLimitServiceWithHealth registers Envoy's rate-limit service
// and the standard gRPC health service on s, as RegisterRateLimitService
// does, and returns the health service. Both the server ("") and
// envoy.service.ratelimit.v3.RateLimitService report SERVING until the
// program calls its Shutdown, as it starts draining: from then on both
// report NOT_SERVING, to Check and to Watch, while calls are still
// answered.
func (m *Middleware) RegisterRateLimitServiceWithHealth(s *grpc.Server) *health.Server {
	rlsv3.RegisterRateLimitServiceServer(s, &rlsServer{m: m})
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	return h
}
