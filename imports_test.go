package epochsketch_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// sharedTooling are the internal packages that the peer benchmarks (module
// bench) share with this module's own benchmarks, so that both measure the
// same key streams against the same floors and draw the same plots. They
// hold nothing of the Sketch.
var sharedTooling = map[string]bool{
	"github.com/epochsketch/epochsketch/internal/floor":     true,
	"github.com/epochsketch/epochsketch/internal/keystream": true,
	"github.com/epochsketch/epochsketch/internal/plot":      true,
}

// No other module of the repository (bench, simulator/e2e, sketchproxy)
// imports this module's internal packages, bar the benchmark tooling above.
// Go's internal rule goes by import path, so it lets them; but another
// module is a user of the library, and what a user needs belongs in the
// public API (LoadFrom replaced such a back door). The check reads every Go
// file's imports, build tags ignored, so no module needs its dependencies
// downloaded.
func TestNoModuleImportsOurInternals(t *testing.T) {
	const internal = "github.com/epochsketch/epochsketch/internal/"
	var modules []string
	filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() == "go.mod" && path != "go.mod" {
			modules = append(modules, filepath.Dir(path))
		}
		return nil
	})
	if len(modules) < 3 {
		t.Fatalf("found the modules %v: want at least bench, simulator/e2e and sketchproxy", modules)
	}
	fset := token.NewFileSet()
	for _, mod := range modules {
		filepath.WalkDir(mod, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") {
				return err
			}
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly)
			if err != nil {
				t.Errorf("%s: %v", path, err)
				return nil
			}
			for _, imp := range f.Imports {
				if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, internal) && !sharedTooling[p] {
					t.Errorf("%s (module %s) imports %s: another module must use the library's public API; add what it needs there", path, mod, p)
				}
			}
			return nil
		})
	}
}
