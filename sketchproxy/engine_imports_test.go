package sketchproxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Only internal/engine holds a sketch: every other file of the module
// (tests aside) names nothing of the library but its Clock, and reaches
// none of the library's internal packages.
func TestOnlyTheEngineUsesTheSketch(t *testing.T) {
	fset := token.NewFileSet()
	const lib = "github.com/epochsketch/epochsketch"
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != "." && err == nil {
				return filepath.SkipDir // another module (caddy)
			}
			if path == filepath.Join("internal", "engine") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		names := map[string]bool{}
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if strings.HasPrefix(p, lib+"/internal/") {
				t.Errorf("%s imports %s: only the engine may reach into the library", path, p)
			}
			if p == lib {
				name := "epochsketch"
				if im.Name != nil {
					name = im.Name.Name
				}
				names[name] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && names[id.Name] && sel.Sel.Name != "Clock" {
					t.Errorf("%s: %s.%s: only internal/engine uses the sketch", fset.Position(sel.Pos()), id.Name, sel.Sel.Name)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The public outcomes keep their names, which metrics and logs write.
func TestOutcomeNames(t *testing.T) {
	names := []string{"allow", "allowlisted", "delay", "drip", "tarpit_full", "in_flight", "budget_unknown", "over_budget", "reject", "ban"}
	for i, o := range []Outcome{Allow, Allowlisted, Delay, Drip, TarpitFull, InFlight, BudgetUnknown, OverBudget, Reject, Ban} {
		if o.String() != names[i] || int(o) != i {
			t.Errorf("outcome %d: %d %q, want %d %q", i, o, o, i, names[i])
		}
	}
	if int(numOutcomes) != len(names) {
		t.Errorf("%d outcomes, want %d", numOutcomes, len(names))
	}
}

// The engine knows no protocol: neither net/http nor gRPC (nor
// Prometheus, nor YAML) is among its dependencies, direct or not.
func TestEngineKnowsNoProtocol(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./internal/engine").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"net/http", "google.golang.org/grpc", "github.com/prometheus/", "go.yaml.in/"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("internal/engine depends on %s", p)
			}
		}
	}
}
