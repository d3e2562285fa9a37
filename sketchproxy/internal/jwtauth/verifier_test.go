package jwtauth

import (
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// Check asks for a token where there is none, refuses one without a claim
// the key needs, and verifies a token once for every rule of a request.
func TestCheck(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	dir := t.TempDir()
	file := filepath.Join(dir, "jwt.secret")
	if err := os.WriteFile(file, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("t.yaml", []byte("jwt: {hmac_secret_file: "+file+", algorithms: [HS256]}\nrules:\n  - key: [\"jwt:sub\"]\n    limits: [{requests: 1, per: 1m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := config.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := New(b.Config().JWT, b.JWT(), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer v.Stop(nil)
	sign := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	exp := time.Now().Add(time.Hour).Unix()
	for _, c := range []struct {
		name, auth string
		key        []string
		want, err  string
	}{
		{"no token", "", []string{"jwt:sub"}, "", ErrNoToken.Error()},
		{"not bearer", "Basic YWxpY2U6eA==", []string{"jwt:sub"}, "", ErrNoToken.Error()},
		{"bad signature", "Bearer " + sign(jwt.MapClaims{"sub": "alice", "exp": exp})[:20] + "x.y.z", []string{"jwt:sub"}, "", "token"},
		{"claim missing", "Bearer " + sign(jwt.MapClaims{"sub": "alice", "exp": exp}), []string{"ip", "jwt:tenant"}, "", `no "tenant" claim`},
		{"claim empty", "Bearer " + sign(jwt.MapClaims{"sub": "", "exp": exp}), []string{"jwt:sub"}, "", `"sub" claim is empty`},
		{"number", "Bearer " + sign(jwt.MapClaims{"sub": 42, "exp": exp}), []string{"jwt:sub"}, "42", ""},
		{"string", "bearer  " + sign(jwt.MapClaims{"sub": "alice", "exp": exp}), []string{"jwt:sub"}, "alice", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			if c.auth != "" {
				r.Header.Set("Authorization", c.auth)
			}
			got, err := v.Check(r, nil, c.key)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one with %q", err, c.err)
				}
				if (c.err == ErrNoToken.Error()) != errors.Is(err, ErrNoToken) {
					t.Errorf("errors.Is(%v, ErrNoToken) = %v", err, errors.Is(err, ErrNoToken))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p, err := got.Part("sub"); err != nil || p != c.want {
				t.Errorf("sub = %q, %v; want %q", p, err, c.want)
			}
			// The claims a request has are checked, never verified again.
			r.Header.Del("Authorization")
			if again, err := v.Check(r, got, c.key); err != nil || len(again) != len(got) {
				t.Errorf("checking the claims held: %v, %v", again, err)
			}
		})
	}
}

// The verifier knows no door: neither the root package nor Envoy's
// service, nor gRPC.
func TestVerifierImportsNoDoor(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, b := range []string{"github.com/epochsketch/epochsketch/sketchproxy\n", "github.com/envoyproxy/", "google.golang.org/grpc\n", "github.com/epochsketch/epochsketch/sketchproxy/internal/rls\n"} {
			if strings.HasPrefix(p+"\n", b) {
				t.Errorf("internal/jwtauth depends on %s", p)
			}
		}
	}
}
