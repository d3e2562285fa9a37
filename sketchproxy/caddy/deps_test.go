package caddyepochsketch

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// notLinked are the modules of SketchProxy's Envoy service and JWT keys:
// a Caddy build links neither, so this module imports SketchProxy's config,
// engine and fleet, never its root package (which holds both).
var notLinked = []string{"github.com/envoyproxy/", "github.com/golang-jwt/", "github.com/MicahParks/keyfunc"}

// rootPackage is SketchProxy's root package.
const rootPackage = "github.com/epochsketch/epochsketch/sketchproxy"

// go.mod requires none of notLinked, even indirectly: what go mod tidy
// keeps is what this module's packages and their tests build.
func TestGoModRequiresNoEnvoyOrJWT(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	required := 0
	for line := range strings.Lines(string(mod)) {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) < 2 || !strings.Contains(f[0], ".") || f[0] == "module" || f[0] == "go" {
			continue
		}
		required++
		for _, p := range notLinked {
			if strings.HasPrefix(f[0], p) {
				t.Errorf("go.mod requires %s %s: a Caddy build would link SketchProxy's Envoy service or JWT keys (import sketchproxy/config, internal/engine and internal/fleet, not %s)", f[0], f[1], rootPackage)
			}
		}
	}
	if required < 10 {
		t.Fatalf("read %d requirements from go.mod: the test does not read it", required)
	}
}

// Neither this module's packages nor their tests import SketchProxy's
// root package or any package of notLinked (go list -deps -test).
func TestImportsNotTheProxy(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command("go", "list", "-deps", "-test", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	n := 0
	for p := range strings.Lines(string(out)) {
		p = strings.TrimSpace(p)
		n++
		if p == rootPackage {
			t.Errorf("a package of this module imports %s", rootPackage)
		}
		for _, q := range notLinked {
			if strings.HasPrefix(p, q) {
				t.Errorf("a package of this module links %s", p)
			}
		}
	}
	if n < 100 {
		t.Fatalf("go list listed %d packages: %s", n, out)
	}
}
