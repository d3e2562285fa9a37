package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// skeletons are the configs whose prepared forms give the defaults: every
// section present in at least one of them, written as little as validation
// allows, and varied where a default follows another setting (a rule's
// place, a limit's period, tarpit, a budget, a jwt key's kind), so that
// such a default differs between them and is reported as one that depends.
// Each list's last element is the one read. {{secret}}, {{cert}} and
// {{key}} are files the generator writes.
var skeletons = []string{`
client_ip: {trusted_proxies: [10.0.0.1]}
jwt: {hmac_secret_file: "{{secret}}"}
fleet: {redis: "127.0.0.1:6379", secret: "0123456789abcdef0123"}
forward_auth: {}
envoy_rls:
  listen: "127.0.0.1:8081"
  tls: {cert_file: "{{cert}}", key_file: "{{key}}"}
  domains:
    - domain: d
      descriptors:
        - key: k
          rate_limit: {unit: second, requests_per_unit: 10, replaces: [{name: other}]}
        - key: other
          rate_limit: {name: other, unit: second, requests_per_unit: 20}
rules:
  - limits: [{requests: 10, per: 10s}]
    budget: {units: 1000, per: 1h}
`, `
jwt: {jwks_url: "https://id.example.com/jwks.json"}
envoy_rls:
  listen: "127.0.0.1:8081"
  domains:
    - domain: d
      descriptors:
        - key: k
          value: v
          rate_limit: {unit: minute, requests_per_unit: 20}
rules:
  - limits: [{requests: 1, per: 1s}]
  - tarpit: true
    limits: [{requests: 20, per: 1m}]
    budget: {units: 2000, per: 1d, cost: 3}
`, `
rules:
  - limits: [{requests: 5, per: 5s}]
`}

// prepared is one skeleton as ParseConfig prepares it, beside the document
// it was written as.
type prepared struct {
	cfg *config.Config
	doc *yaml.Node // the mapping at the document's top
}

// prepareSkeletons writes the files the skeletons name into a temporary
// directory and prepares each.
func prepareSkeletons() ([]prepared, error) {
	dir, err := os.MkdirTemp("", "configref")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	files, err := skeletonFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []prepared
	for i, s := range skeletons {
		for name, path := range files {
			s = strings.ReplaceAll(s, "{{"+name+"}}", path)
		}
		cfg, err := config.Parse(fmt.Sprintf("skeleton %d", i+1), []byte(s))
		if err != nil {
			return nil, err
		}
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(s), &doc); err != nil {
			return nil, err
		}
		out = append(out, prepared{cfg: cfg, doc: doc.Content[0]})
	}
	return out, nil
}

// skeletonFiles writes a jwt secret and a self-signed certificate with its
// key, for the skeletons' jwt and envoy_rls.tls, whose files are read when
// the config is validated.
func skeletonFiles(dir string) (map[string]string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "configref"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"configref"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"secret": []byte(strings.Repeat("s", 32)),
		"cert":   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"key":    pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	paths := map[string]string{}
	for name, b := range files {
		paths[name] = filepath.Join(dir, name)
		if err := os.WriteFile(paths[name], b, 0o600); err != nil {
			return nil, err
		}
	}
	return paths, nil
}
