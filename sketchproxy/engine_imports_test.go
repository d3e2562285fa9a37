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

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
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

// The public outcomes are the engine's, value for value, and keep their
// names: metrics and Decisions read one as the other.
func TestOutcomesMatchTheEngine(t *testing.T) {
	for _, c := range []struct {
		pub  Outcome
		eng  engine.Outcome
		name string
	}{
		{Allow, engine.Allow, "allow"}, {Allowlisted, engine.Allowlisted, "allowlisted"}, {Delay, engine.Delay, "delay"},
		{Drip, engine.Drip, "drip"}, {TarpitFull, engine.TarpitFull, "tarpit_full"}, {InFlight, engine.InFlight, "in_flight"},
		{BudgetUnknown, engine.BudgetUnknown, "budget_unknown"}, {OverBudget, engine.OverBudget, "over_budget"},
		{Reject, engine.Reject, "reject"}, {Ban, engine.Ban, "ban"},
	} {
		if uint8(c.pub) != uint8(c.eng) || c.pub.String() != c.name {
			t.Errorf("%s: %d (%q) here, %d in the engine", c.name, c.pub, c.pub, c.eng)
		}
	}
	if int(numOutcomes) != int(engine.NumOutcomes) {
		t.Errorf("%d outcomes here, %d in the engine", numOutcomes, engine.NumOutcomes)
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
