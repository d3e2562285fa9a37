package fleet

import (
	"os/exec"
	"strings"
	"testing"
)

// The fleet links neither Envoy's protobufs nor a JWT library, direct or
// not: the Caddy module links the fleet, and must not link those
// (sketchproxy/caddy/deps_test.go holds the whole module to it).
func TestFleetKnowsNoEnvoyNorJWT(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	ps := strings.Fields(string(out))
	if len(ps) < 50 {
		t.Fatalf("go list listed %d packages: %s", len(ps), out)
	}
	for _, p := range ps {
		if p == "github.com/epochsketch/epochsketch/sketchproxy" {
			t.Errorf("internal/fleet depends on the root package")
		}
		for _, banned := range []string{"github.com/envoyproxy/", "github.com/golang-jwt/", "github.com/MicahParks/keyfunc"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("internal/fleet depends on %s", p)
			}
		}
	}
}
