package config

import (
	"os/exec"
	"strings"
	"testing"
)

// Package config is what the Caddy module builds on: neither Envoy's
// protobufs nor a JWT library (nor gRPC beyond its keepalive settings, nor
// Prometheus) is among its dependencies, direct or not, and the engine,
// which the config compiles for, does not import it.
func TestConfigKnowsNoProtocol(t *testing.T) {
	for pkg, banned := range map[string][]string{
		".": {"github.com/envoyproxy/", "github.com/golang-jwt/", "github.com/MicahParks/keyfunc", "google.golang.org/protobuf",
			"github.com/prometheus/", "github.com/epochsketch/epochsketch/sketchproxy\n"},
		"../internal/engine": {"github.com/epochsketch/epochsketch/sketchproxy/config"},
	} {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		for _, p := range strings.Fields(string(out)) {
			if strings.HasPrefix(p, "google.golang.org/grpc") && p != "google.golang.org/grpc/keepalive" {
				t.Errorf("%s depends on %s", pkg, p)
			}
			for _, b := range banned {
				if strings.HasPrefix(p+"\n", b) {
					t.Errorf("%s depends on %s", pkg, p)
				}
			}
		}
	}
}
