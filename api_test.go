package epochsketch_test

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"testing"
)

// exported lists the package's exported names (methods as Type.Method) in a
// build with the given tags, from its non-test files.
func exported(t *testing.T, tags ...string) []string {
	t.Helper()
	ctx := build.Default
	ctx.BuildTags = tags
	pkg, err := ctx.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, name := range pkg.GoFiles {
		f, err := parser.ParseFile(fset, filepath.Join(pkg.Dir, name), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv != nil {
					typ := d.Recv.List[0].Type
					if star, ok := typ.(*ast.StarExpr); ok {
						typ = star.X
					}
					names = append(names, typ.(*ast.Ident).Name+"."+d.Name.Name)
					continue
				}
				names = append(names, d.Name.Name)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
						}
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// A trace build (-tags epochsketch_trace, the browser simulator's) has
// exactly the API of a normal build: the trace's types and SetTracer are
// internal/lab's.
func TestTraceBuildKeepsTheAPI(t *testing.T) {
	startsProcesses(t) // go/build runs the go command
	normal, traced := exported(t), exported(t, "epochsketch_trace")
	if len(normal) < 20 {
		t.Fatalf("found %d exported names: the scan no longer reads the package", len(normal))
	}
	if !slices.Equal(normal, traced) {
		t.Errorf("the trace build's API differs:\nnormal: %v\ntraced: %v", normal, traced)
	}
}
