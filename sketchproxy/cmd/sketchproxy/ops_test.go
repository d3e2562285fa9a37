package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// swapConfigMap writes files as a new version of a ConfigMap mounted at
// dir, as the kubelet does: a new timestamped directory, the ..data link
// swapped to it in one rename, then a top-level link NAME -> ..data/NAME
// for each new name and none for a name gone.
func swapConfigMap(t *testing.T, dir string, version int, files map[string]string) {
	t.Helper()
	ts := fmt.Sprintf("..2026_02_%02d_12_00_00.%09d", version, version)
	if err := os.MkdirAll(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if name := e.Name(); !strings.HasPrefix(name, ".") && files[name] == "" {
			os.Remove(filepath.Join(dir, name))
		}
	}
	for name := range files {
		os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)) // an existing link stays
	}
}

// rlsLimit asks domain's key=value once and returns the limit matched.
func rlsLimit(t *testing.T, client rlsv3.RateLimitServiceClient, domain, key, value string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{desc(key, value)}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
}

// limitBecomes asks, until it answers want or 15 s pass, for the limit of
// domain's descriptor user=ann, key=k: the reloads that follow a swap are
// readiness signals only the service itself can give.
func limitBecomes(t *testing.T, client rlsv3.RateLimitServiceClient, domain string, want uint32) {
	t.Helper()
	key := map[string]string{"edge": "user", "api": "key"}[domain]
	var got uint32
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got = rlsLimit(t, client, domain, key, "k"); got == want {
			return
		}
	}
	t.Fatalf("%s's limit stayed %d, want %d", domain, got, want)
}

// envoy_rls.directory reloads by itself: a ConfigMap swap is live without
// a signal, a broken version is logged once with its file and line while
// the running domains stay, and the next good version applies.
func TestBinaryEnvoyRLSDirectory(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	rl := filepath.Join(dir, "ratelimit")
	edge := func(n int) string {
		return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
	}
	swapConfigMap(t, rl, 1, map[string]string{"edge.yaml": edge(100)})
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  directory: ratelimit\n  watch_every: 20ms\n"), 0o644)
	_, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client, "edge", "user", "ann"); got != 100 {
		t.Fatalf("limit %d, want 100", got)
	}

	// A new version: edge's limit changed, and a new file whose metadata
	// is ignored with a warning.
	swapConfigMap(t, rl, 2, map[string]string{
		"edge.yaml": edge(7),
		"api.yaml":  "domain: api\ndescriptors:\n  - key: key\n    metadata: {owner: team-a}\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
	})
	// The kubelet's update is two steps (the ..data swap, then the new
	// link): wait until both are live.
	limitBecomes(t, client, "edge", 7)
	limitBecomes(t, client, "api", 9)
	if !regexp.MustCompile(`level=WARN msg="config: \S*api.yaml:4: descriptors\[0\]\.metadata: ignored`).MatchString(out.String()) {
		t.Errorf("no warning about api.yaml's metadata:\n%s", out)
	}

	// A broken version: logged with the file and line, the running
	// domains stay.
	swapConfigMap(t, rl, 3, map[string]string{"edge.yaml": edge(7), "api.yaml": "domain: api\ndescriptors:\n  - key: key\n    rate_limt: {}\n"})
	m := waitFor(t, out, regexp.MustCompile(`msg="reload failed: keeping the running config" err="([^"]*)"`))
	if !strings.Contains(m[1], filepath.Join(rl, "api.yaml")+":4:") {
		t.Errorf("the error %q does not name api.yaml:4", m[1])
	}
	if got := rlsLimit(t, client, "api", "key", "k"); got != 9 {
		t.Errorf("after a broken version: api's limit %d, want the running 9", got)
	}

	// Fixed: applied; the broken version was reported once, not at every
	// look in between.
	swapConfigMap(t, rl, 4, map[string]string{"edge.yaml": edge(3)})
	limitBecomes(t, client, "edge", 3)
	limitBecomes(t, client, "api", 0)
	if n := strings.Count(out.String(), "reload failed"); n != 1 {
		t.Errorf("the broken version was reported %d times, want once:\n%s", n, out)
	}
}

// A directory change whose reload fails for another reason (the TLS
// certificate broken meanwhile, as the reviewer did with a ConfigMap swap)
// is retried until the directory is live: restoring the certificate makes
// the new limit apply without SIGHUP (the failed digest was marked asked
// and never retried), and the failure is logged once, not at every retry.
func TestBinaryEnvoyRLSDirectoryRetriesFailedReload(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	ca := newTestCA(t, nil, "CA")
	server := newTestCA(t, ca, "server", "sketchproxy.test")
	os.Mkdir(filepath.Join(dir, "tls"), 0o755)
	crt := filepath.Join(dir, "tls", "tls.crt")
	os.WriteFile(crt, server.pem, 0o644)
	os.WriteFile(filepath.Join(dir, "tls", "tls.key"), server.keyPEM(t), 0o600)
	rl := filepath.Join(dir, "ratelimit")
	edge := func(n int) string {
		return fmt.Sprintf("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d}\n", n)
	}
	swapConfigMap(t, rl, 1, map[string]string{"edge.yaml": edge(100)})
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  directory: ratelimit\n  watch_every: 20ms\n  tls: {cert_file: tls/tls.crt, key_file: tls/tls.key}\n"), 0o644)
	_, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+) .* tls=on`))[1]
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "sketchproxy.test"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	if got := rlsLimit(t, client, "edge", "user", "k"); got != 100 {
		t.Fatalf("limit %d, want 100", got)
	}

	os.WriteFile(crt, []byte("not a certificate\n"), 0o644)
	waitFor(t, out, regexp.MustCompile(`msg="tls: new files not loaded`))
	swapConfigMap(t, rl, 2, map[string]string{"edge.yaml": edge(7)})
	waitFor(t, out, regexp.MustCompile(`msg="reload failed: keeping the running config" err="[^"]*tls`))
	if got := rlsLimit(t, client, "edge", "user", "k"); got != 100 {
		t.Fatalf("with the certificate broken: limit %d, want the running 100", got)
	}
	os.WriteFile(crt, server.pem, 0o644)
	limitBecomes(t, client, "edge", 7)
	if n := strings.Count(out.String(), "reload failed"); n != 1 {
		t.Errorf("the failed reload was logged %d times, want once:\n%s", n, out)
	}
}

// SIGTERM drains: the gRPC health service reports NOT_SERVING at once, for
// the server and the rate-limit service, and /healthz answers 503, while
// calls are still answered for -drain; a second SIGTERM ends the drain and
// the process stops cleanly.
func TestBinaryEnvoyRLSDrain(t *testing.T) {
	bin := build(t)
	cfg := filepath.Join(t.TempDir(), "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"127.0.0.1:0\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n"+rlsEdgeDomain), 0o644)
	cmd, out := start(t, bin, "-config", cfg, "-drain", "10m")
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+)`))[1]
	admin := "http://" + waitFor(t, out, regexp.MustCompile(`msg="admin listening" addr=(\S+)`))[1] + "/healthz"
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client, hc := rlsv3.NewRateLimitServiceClient(conn), healthpb.NewHealthClient(conn)
	health := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		h, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health %q: %v", svc, err)
		}
		return h.GetStatus()
	}
	services := []string{"", "envoy.service.ratelimit.v3.RateLimitService"}
	for _, svc := range services {
		if got := health(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q before SIGTERM: %v", svc, got)
		}
	}
	if got := codes(t, admin, 1); got != "200" {
		t.Fatalf("/healthz before SIGTERM: %s", got)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, out, regexp.MustCompile(`msg="draining: health reports NOT_SERVING`))
	for _, svc := range services {
		if got := health(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health %q while draining: %v, want NOT_SERVING", svc, got)
		}
	}
	if got := codes(t, admin, 1); got != "503" {
		t.Errorf("/healthz while draining: %s, want 503", got)
	}
	if got := rlsLimit(t, client, "edge", "user", "ann"); got != 100 {
		t.Errorf("a call while draining: limit %d, want 100", got)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "msg=stopped") || !strings.Contains(out.String(), "draining cut short") {
			t.Errorf("exit %v:\n%s", err, out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30 s after the second SIGTERM:\n%s", out)
	}
}

// rlsEdgeDomain is envoy_rls's domains: edge, 100 an hour per user.
const rlsEdgeDomain = "  domains:\n    - domain: edge\n      descriptors:\n        - key: user\n          rate_limit: {unit: hour, requests_per_unit: 100}\n"

// testCA signs certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// newTestCA makes a CA, or with parent a leaf it signs for cn, naming
// 127.0.0.1 and dns.
func newTestCA(t *testing.T, parent *testCA, cn string, dns ...string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sn, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: sn, Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	signer, signerKey := tmpl, key
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	} else {
		tmpl.DNSNames, tmpl.IPAddresses = dns, []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		signer, signerKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// keyPEM is c's private key, PEM.
func (c *testCA) keyPEM(t *testing.T) []byte {
	der, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// Mutual TLS on the binary: Envoy's generated client over TLS with a
// client certificate is answered, a client without one is not; a renewed
// server certificate swapped in as a Kubernetes Secret is picked up by the
// watcher and served to new connections.
func TestBinaryEnvoyRLSMutualTLS(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	ca := newTestCA(t, nil, "CA")
	server1, envoy := newTestCA(t, ca, "server-1", "sketchproxy.test"), newTestCA(t, ca, "envoy", "envoy.test")
	tlsDir := filepath.Join(dir, "tls")
	swapConfigMap(t, tlsDir, 1, map[string]string{"tls.crt": string(server1.pem), "tls.key": string(server1.keyPEM(t)), "ca.crt": string(ca.pem)})
	cfg := filepath.Join(dir, "rls.yaml")
	os.WriteFile(cfg, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  watch_every: 20ms\n  tls: {cert_file: tls/tls.crt, key_file: tls/tls.key, client_ca_file: tls/ca.crt, client_san: envoy.test}\n"+rlsEdgeDomain), 0o644)
	_, out := start(t, bin, "-config", cfg)
	addr := waitFor(t, out, regexp.MustCompile(`msg="envoy rate limit service listening" protocol=grpc addr=(\S+) .* tls=mutual`))[1]
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	clientTLS := &tls.Config{RootCAs: roots, ServerName: "sketchproxy.test",
		Certificates: []tls.Certificate{{Certificate: [][]byte{envoy.cert.Raw}, PrivateKey: envoy.key}}}
	call := func(tc *tls.Config) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{desc("user", "ann")}})
		return err
	}
	if err := call(clientTLS); err != nil {
		t.Fatalf("Envoy's client with its certificate: %v", err)
	}
	noCert := clientTLS.Clone()
	noCert.Certificates = nil
	if err := call(noCert); err == nil {
		t.Error("a client without a certificate was answered")
	}
	served := func() string {
		tc := clientTLS.Clone()
		tc.NextProtos = []string{"h2"}
		c, err := tls.Dial("tcp", addr, tc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	server2 := newTestCA(t, ca, "server-2", "sketchproxy.test")
	swapConfigMap(t, tlsDir, 2, map[string]string{"tls.crt": string(server2.pem), "tls.key": string(server2.keyPEM(t)), "ca.crt": string(ca.pem)})
	waitFor(t, out, regexp.MustCompile(`msg="tls: certificate reloaded`))
	if cn := served(); cn != "server-2" {
		t.Errorf("after the swap: %s served, want server-2", cn)
	}
	if err := call(clientTLS); err != nil {
		t.Errorf("after the swap: %v", err)
	}
}
