package sketchproxy

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// RLSTLSConfig serves envoy_rls's gRPC over TLS, as envoyproxy/ratelimit's
// GRPC_SERVER_USE_TLS does, and with ClientCAFile over mutual TLS (its
// GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN). Paths are relative to
// this config's directory, as envoy_rls.files. cmd/sketchproxy reads the
// files again every envoy_rls.watch_every: a renewed certificate (a
// Kubernetes Secret swapped by symlink included) is served to new
// connections without a restart, and files that do not load are logged
// with the reason while the running certificate stays.
type RLSTLSConfig struct {
	// CertFile is the server's certificate chain, PEM (required).
	CertFile string `yaml:"cert_file" example:"/etc/sketchproxy/tls/tls.crt"`
	// KeyFile is the private key of CertFile's certificate, PEM
	// (required).
	KeyFile string `yaml:"key_file" example:"/etc/sketchproxy/tls/tls.key"`
	// ClientCAFile, if set, requires every client to present a
	// certificate signed by one of its CAs (PEM): mutual TLS.
	ClientCAFile string `yaml:"client_ca_file" example:"/etc/sketchproxy/tls/ca.crt"`
	// ClientSAN, if set, further requires the client's certificate to name
	// it among its subject alternative names (a DNS name or an IP
	// address). It needs ClientCAFile.
	ClientSAN string `yaml:"client_san" example:"envoy.internal"`
}

// validateRLSTLS checks envoy_rls.tls: its files must load into a server
// configuration now.
func (c *Config) validateRLSTLS() error {
	t := c.EnvoyRLS.TLS
	if t == nil {
		return nil
	}
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		return c.errAt("give cert_file and key_file (PEM): the server's certificate chain and its key", "envoy_rls", "tls")
	case t.ClientSAN != "" && t.ClientCAFile == "":
		return c.errAt("client_san needs client_ca_file: only a verified client certificate can be checked for a name", "envoy_rls", "tls", "client_san")
	}
	if _, _, field, err := c.rlsTLSFiles().load(); err != nil {
		return c.errAt(err.Error(), "envoy_rls", "tls", field)
	}
	return nil
}

// rlsTLSFiles are envoy_rls.tls's files, resolved.
type rlsTLSFiles struct {
	cert, key, ca, san string
}

func (c *Config) rlsTLSFiles() rlsTLSFiles {
	t := c.EnvoyRLS.TLS
	return rlsTLSFiles{cert: c.rlsPath(t.CertFile), key: c.rlsPath(t.KeyFile), ca: c.rlsPath(t.ClientCAFile), san: t.ClientSAN}
}

// load reads the files into a server configuration, with a digest of what
// they hold; an error names the field whose file failed.
func (f rlsTLSFiles) load() (cfg *tls.Config, digest, field string, err error) {
	// The digest covers what was read, or why it could not be: the same
	// broken files give the same digest, and Reload reports them once.
	h := sha256.New()
	read := func(path, name string) []byte {
		b, e := os.ReadFile(path)
		if e != nil && err == nil {
			err, field = e, name
		}
		fmt.Fprintf(h, "%d\x00%v\x00", len(b), e)
		h.Write(b)
		return b
	}
	certPEM := read(f.cert, "cert_file")
	keyPEM := read(f.key, "key_file")
	var caPEM []byte
	if f.ca != "" {
		caPEM = read(f.ca, "client_ca_file")
	}
	digest = hex.EncodeToString(h.Sum(nil))
	if err != nil {
		return nil, digest, field, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, digest, "cert_file", fmt.Errorf("%s and %s: %v", f.cert, f.key, err)
	}
	cfg = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if f.ca != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, digest, "client_ca_file", fmt.Errorf("%s holds no PEM certificate", f.ca)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	if san := f.san; san != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("no client certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
				return fmt.Errorf("the client certificate does not name %s (envoy_rls.tls.client_san): %v", san, err)
			}
			return nil
		}
	}
	return cfg, digest, "", nil
}

// GRPCTLS is the TLS of envoy_rls's gRPC listener: the server certificate
// and, for mutual TLS, the client CAs, from envoy_rls.tls's files. Reload
// reads them again; new connections get what was last loaded.
type GRPCTLS struct {
	files rlsTLSFiles
	cur   atomic.Pointer[tls.Config]

	mu   sync.Mutex // one Reload at a time
	seen string     // the digest of the files at the last Reload, loaded or not
}

// NewGRPCTLS loads cfg's envoy_rls.tls; it returns nil without one.
func NewGRPCTLS(cfg *Config) (*GRPCTLS, error) {
	if cfg.EnvoyRLS == nil || cfg.EnvoyRLS.TLS == nil {
		return nil, nil
	}
	g := &GRPCTLS{files: cfg.rlsTLSFiles()}
	tc, digest, field, err := g.files.load()
	if err != nil {
		return nil, cfg.errAt(err.Error(), "envoy_rls", "tls", field)
	}
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
	tc, digest, field, err := g.files.load()
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
