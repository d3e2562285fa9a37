package sketchproxy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/MicahParks/keyfunc/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// Package config checks jwt.jwks_file with jwkset alone (it imports no JWT
// library), where the verifier reads the file with keyfunc: a file one
// refuses, the other refuses too, in keyfunc's words, so -check says what
// the start would.
func TestJWKSFileErrorsReadAsKeyfuncs(t *testing.T) {
	dir := t.TempDir()
	refused := 0
	for name, set := range map[string]string{
		"good":      string(newJWTKeys(t).jwks),
		"not json":  `{"keys": [`,
		"keys a 5":  `{"keys": 5}`,
		"a list":    `[]`,
		"bad kty":   `{"keys": [{"kty": "nope", "kid": "a"}]}`,
		"bad n":     `{"keys": [{"kty": "RSA", "kid": "k1", "n": "!!", "e": "AQAB"}]}`,
		"ec no crv": `{"keys": [{"kty": "EC", "kid": "k2", "x": "AA", "y": "AA"}]}`,
		"no keys":   `{"keys": []}`,
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(set), 0o600); err != nil {
			t.Fatal(err)
		}
		_, want := keyfunc.NewJWKSetJSON([]byte(set))
		_, err := ParseConfig("p.yaml", []byte("jwt: {jwks_file: "+path+"}\nrules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 1, per: 1s}]\n"))
		switch {
		case want == nil && err != nil:
			t.Errorf("%s: keyfunc reads it, the config refuses it: %v", name, err)
		case want != nil && (err == nil || !strings.HasSuffix(err.Error(), "jwt.jwks_file: not a JSON Web Key Set: "+want.Error())):
			t.Errorf("%s: keyfunc says %q, the config %v", name, want, err)
		case want != nil:
			refused++
		}
	}
	if refused < 3 {
		t.Errorf("keyfunc refused %d of the sets, want the broken ones (3 or more) refused", refused)
	}
}

// The Envoy service sends a descriptor's unit as config numbers it: those
// numbers are Envoy's, for every unit a file can name.
func TestRLSUnitsAreEnvoys(t *testing.T) {
	for _, unit := range []string{"second", "minute", "hour", "day", "week", "month", "year"} {
		cfg, err := ParseConfig("p.yaml", []byte("envoy_rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: d\n      descriptors:\n        - {key: k, rate_limit: {unit: "+unit+", requests_per_unit: 3}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := config.Build(cfg)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := b.RLS().Domain("d").Child("k", "v")
		if n == nil {
			t.Fatalf("%s: no descriptor for k", unit)
		}
		if got, want := rlsv3.RateLimitResponse_RateLimit_Unit(n.Unit()), rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]); got != want || want == rlsv3.RateLimitResponse_RateLimit_UNKNOWN {
			t.Errorf("unit %s: sent as %v, want %v", unit, got, want)
		}
	}
}
