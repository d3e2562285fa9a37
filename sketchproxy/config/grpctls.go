package config

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
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
	if _, _, field, err := c.rlsTLSFiles().Load(); err != nil {
		return c.errAt(err.Error(), "envoy_rls", "tls", field)
	}
	return nil
}

// GRPCTLSFiles are envoy_rls.tls's files, resolved: what the gRPC
// listener's TLS reads at the start and again at each reload.
type GRPCTLSFiles struct {
	cert, key, ca, san string
}

func (c *Config) rlsTLSFiles() GRPCTLSFiles {
	t := c.EnvoyRLS.TLS
	return GRPCTLSFiles{cert: c.rlsPath(t.CertFile), key: c.rlsPath(t.KeyFile), ca: c.rlsPath(t.ClientCAFile), san: t.ClientSAN}
}

// LoadGRPCTLS loads c's envoy_rls.tls: its files, resolved, and what they
// hold now as a server configuration, with a digest of it (Load). Without
// envoy_rls.tls tc is nil. An error is an *Error naming the field whose
// file failed.
func LoadGRPCTLS(c *Config) (files GRPCTLSFiles, tc *tls.Config, digest string, err error) {
	if c.EnvoyRLS == nil || c.EnvoyRLS.TLS == nil {
		return GRPCTLSFiles{}, nil, "", nil
	}
	files = c.rlsTLSFiles()
	tc, digest, field, err := files.Load()
	if err != nil {
		return files, nil, "", c.errAt(err.Error(), "envoy_rls", "tls", field)
	}
	return files, tc, digest, nil
}

// Load reads the files into a server configuration, with a digest of what
// they hold; an error names the field whose file failed.
func (f GRPCTLSFiles) Load() (cfg *tls.Config, digest, field string, err error) {
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
