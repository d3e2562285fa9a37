package sketchproxy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// testCA is a certificate authority for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate for cn, naming dns and 127.0.0.1, and
// returns its PEM certificate and key.
func (ca *testCA) issue(t *testing.T, cn string, dns ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: dns, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// pair is a client certificate for tls.Config.Certificates.
func pair(t *testing.T, certPEM, keyPEM []byte) tls.Certificate {
	t.Helper()
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// secret lays files out in dir as the kubelet mounts a Secret: links to
// ..data/NAME, with ..data swapped to a new directory at each call.
func secret(t *testing.T, dir string, files map[string][]byte) {
	t.Helper()
	serial++
	ts := filepath.Join(dir, "..v"+big.NewInt(serial).String())
	os.MkdirAll(ts, 0o755)
	for name, b := range files {
		os.WriteFile(filepath.Join(ts, name), b, 0o600)
		os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name))
	}
	os.Symlink(filepath.Base(ts), filepath.Join(dir, "..tmp"))
	if err := os.Rename(filepath.Join(dir, "..tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// tlsServer serves envoy_rls over the TLS of the config in main, and
// returns its address and the reloader.
func tlsServer(t *testing.T, main string) (string, *GRPCTLS) {
	t.Helper()
	cfg, err := LoadConfig(main)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGRPCTLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(g.Credentials()))
	h := mw.RegisterRateLimitServiceWithHealth(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { h.Shutdown(); srv.Stop(); mw.Close() })
	return ln.Addr().String(), g
}

// callTLS makes one ShouldRateLimit call over a new connection with tc's
// TLS (nil: plain gRPC) and returns its error.
func callTLS(t *testing.T, addr string, tc *tls.Config) error {
	t.Helper()
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "ann"}}}}})
	if err == nil && resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 100 {
		t.Errorf("answer %v, want edge's limit of 100", resp)
	}
	if err == nil {
		h, herr := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if herr != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health over TLS: %v %v", h, herr)
		}
	}
	return err
}

// servedCN is the common name of the certificate the server presents to a
// new connection.
func servedCN(t *testing.T, addr string, tc *tls.Config) string {
	t.Helper()
	tc = tc.Clone()
	tc.NextProtos = []string{"h2"}
	c, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

const tlsDomain = "  domains:\n    - domain: edge\n      descriptors:\n        - key: user\n          rate_limit: {unit: hour, requests_per_unit: 100}\n"

// TLS from files: a real gRPC client over TLS is answered, plain text is
// not; a renewed certificate swapped in as a Kubernetes Secret is served
// to new connections after Reload; broken files are reported once and the
// running certificate stays.
func TestRLSTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "test CA")
	cert, key := ca.issue(t, "server-1", "sketchproxy.test")
	secret(t, filepath.Join(dir, "tls"), map[string][]byte{"tls.crt": cert, "tls.key": key})
	main := filepath.Join(dir, "main.yaml")
	os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: 127.0.0.1:0\n  tls: {cert_file: tls/tls.crt, key_file: tls/tls.key}\n"+tlsDomain), 0o644)
	addr, g := tlsServer(t, main)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	client := &tls.Config{RootCAs: roots, ServerName: "sketchproxy.test"}

	if err := callTLS(t, addr, client); err != nil {
		t.Fatalf("a TLS client: %v", err)
	}
	if err := callTLS(t, addr, nil); err == nil {
		t.Error("a plain-text client was answered by the TLS listener")
	}
	if err := callTLS(t, addr, &tls.Config{ServerName: "sketchproxy.test"}); err == nil {
		t.Error("a client that does not trust the CA was answered")
	}
	if changed, err := g.Reload(); changed || err != nil {
		t.Errorf("Reload of unchanged files: %v %v", changed, err)
	}

	cert2, key2 := ca.issue(t, "server-2", "sketchproxy.test")
	secret(t, filepath.Join(dir, "tls"), map[string][]byte{"tls.crt": cert2, "tls.key": key2})
	if cn := servedCN(t, addr, client); cn != "server-1" {
		t.Errorf("before Reload: %s served, want server-1", cn)
	}
	if changed, err := g.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a renewed certificate: %v %v", changed, err)
	}
	if cn := servedCN(t, addr, client); cn != "server-2" {
		t.Errorf("after Reload: %s served, want server-2", cn)
	}

	// A key that does not match its certificate: reported with the
	// field, once; server-2 stays.
	_, otherKey := ca.issue(t, "other")
	secret(t, filepath.Join(dir, "tls"), map[string][]byte{"tls.crt": cert, "tls.key": otherKey})
	changed, err := g.Reload()
	if changed || err == nil || !strings.Contains(err.Error(), "envoy_rls.tls.cert_file: ") || !strings.Contains(err.Error(), "tls.key") {
		t.Errorf("Reload of a mismatched key: %v %v", changed, err)
	}
	if changed, err := g.Reload(); changed || err != nil {
		t.Errorf("the same broken files again: %v %v, want them reported once", changed, err)
	}
	if cn := servedCN(t, addr, client); cn != "server-2" {
		t.Errorf("after broken files: %s served, want the running server-2", cn)
	}
	if err := callTLS(t, addr, client); err != nil {
		t.Errorf("after broken files: %v", err)
	}
}

// Mutual TLS: only a client certificate of client_ca_file's CAs, naming
// client_san, is answered; a new client CA swapped in applies after
// Reload.
func TestRLSMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "server CA")
	clientCA := newTestCA(t, "client CA")
	otherCA := newTestCA(t, "other CA")
	cert, key := ca.issue(t, "server", "sketchproxy.test")
	secret(t, filepath.Join(dir, "tls"), map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": clientCA.pem})
	main := filepath.Join(dir, "main.yaml")
	os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: 127.0.0.1:0\n  tls:\n    cert_file: tls/tls.crt\n    key_file: tls/tls.key\n    client_ca_file: tls/ca.crt\n    client_san: envoy.test\n"+tlsDomain), 0o644)
	addr, g := tlsServer(t, main)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	with := func(certPEM, keyPEM []byte) *tls.Config {
		tc := &tls.Config{RootCAs: roots, ServerName: "sketchproxy.test"}
		if certPEM != nil {
			tc.Certificates = []tls.Certificate{pair(t, certPEM, keyPEM)}
		}
		return tc
	}
	envoyCert, envoyKey := clientCA.issue(t, "envoy", "envoy.test")
	if err := callTLS(t, addr, with(envoyCert, envoyKey)); err != nil {
		t.Fatalf("a client certificate of the client CA naming envoy.test: %v", err)
	}
	for name, tc := range map[string]*tls.Config{
		"no client certificate":           with(nil, nil),
		"a certificate of another CA":     with(otherCA.issue(t, "envoy", "envoy.test")),
		"a certificate naming other.test": with(clientCA.issue(t, "other", "other.test")),
	} {
		if err := callTLS(t, addr, tc); err == nil {
			t.Errorf("%s: answered", name)
		}
	}
	// The client CA rotated: the other CA's clients are answered, the
	// old one's are not.
	secret(t, filepath.Join(dir, "tls"), map[string][]byte{"tls.crt": cert, "tls.key": key, "ca.crt": otherCA.pem})
	if changed, err := g.Reload(); !changed || err != nil {
		t.Fatalf("Reload of a new client CA: %v %v", changed, err)
	}
	if err := callTLS(t, addr, with(otherCA.issue(t, "envoy", "envoy.test"))); err != nil {
		t.Errorf("a client of the new CA: %v", err)
	}
	if err := callTLS(t, addr, with(envoyCert, envoyKey)); err == nil {
		t.Error("a client of the old CA was answered after the rotation")
	}
}

// envoy_rls.tls's mistakes are errors naming the field and the line.
func TestRLSTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "CA")
	cert, key := ca.issue(t, "server")
	os.WriteFile(filepath.Join(dir, "c.pem"), cert, 0o600)
	os.WriteFile(filepath.Join(dir, "k.pem"), key, 0o600)
	os.WriteFile(filepath.Join(dir, "junk.pem"), []byte("not PEM"), 0o600)
	for _, c := range []struct{ tls, want string }{
		{"tls: {cert_file: c.pem}", "main.yaml:4: envoy_rls.tls: give cert_file and key_file"},
		{"tls: {cert_file: c.pem, key_file: nope.pem}", "main.yaml:4: envoy_rls.tls.key_file: open " + filepath.Join(dir, "nope.pem") + ": no such file"},
		{"tls: {cert_file: junk.pem, key_file: k.pem}", "envoy_rls.tls.cert_file: " + filepath.Join(dir, "junk.pem") + " and " + filepath.Join(dir, "k.pem") + ": tls: failed to find any PEM data"},
		{"tls: {cert_file: c.pem, key_file: k.pem, client_ca_file: junk.pem}", "envoy_rls.tls.client_ca_file: " + filepath.Join(dir, "junk.pem") + " holds no PEM certificate"},
		{"tls: {cert_file: c.pem, key_file: k.pem, client_san: envoy}", "envoy_rls.tls.client_san: client_san needs client_ca_file"},
	} {
		main := filepath.Join(dir, "main.yaml")
		os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: 127.0.0.1:0\n  "+c.tls+"\n"+tlsDomain), 0o644)
		_, err := LoadConfig(main)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n got %v\nwant %q", c.tls, err, c.want)
		}
	}
}
