package rls

import (
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/credentials"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// TLS is the TLS of envoy_rls's gRPC listener: the server certificate
// and, for mutual TLS, the client CAs, from envoy_rls.tls's files. Reload
// reads them again; new connections get what was last loaded.
type TLS struct {
	files config.GRPCTLSFiles
	cur   atomic.Pointer[tls.Config]

	mu   sync.Mutex // one Reload at a time
	seen string     // the digest of the files at the last Reload, loaded or not
}

// LoadTLS loads cfg's envoy_rls.tls; it returns nil without one.
func LoadTLS(cfg *config.Config) (*TLS, error) {
	files, tc, digest, err := config.LoadGRPCTLS(cfg)
	if tc == nil || err != nil {
		return nil, err
	}
	g := &TLS{files: files}
	g.cur.Store(tc)
	g.seen = digest
	return g, nil
}

// Credentials are the gRPC server's transport credentials: each handshake
// uses the configuration loaded last.
func (g *TLS) Credentials() credentials.TransportCredentials {
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
func (g *TLS) Reload() (changed bool, err error) {
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
