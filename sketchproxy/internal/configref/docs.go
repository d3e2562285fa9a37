package main

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"unicode"
)

// typeDoc is what the source says of one struct type: its doc comment and
// its fields', by Go name.
type typeDoc struct {
	doc    string
	fields map[string]string
}

// readDocs parses the package in dir (its test files left out) and returns
// the doc comments of its struct types and their fields. A field's doc is
// the comment above it and the one after it on its line, joined; a field
// without either, declared on the line under another whose comment names
// it ("Interval ...; Timeout bounds a round"), shares that comment, as a
// comment over a block of fields reads.
func readDocs(dir string) (map[string]*typeDoc, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "github.com/epochsketch/epochsketch/sketchproxy/config")
	if err != nil {
		return nil, err
	}
	docs := map[string]*typeDoc{}
	for _, t := range pkg.Types {
		for _, spec := range t.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok || ts.Name.Name != t.Name {
				continue
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			td := &typeDoc{doc: t.Doc, fields: map[string]string{}}
			prev, prevLine := "", -1
			for _, f := range st.Fields.List {
				text := strings.TrimSpace(f.Doc.Text() + "\n" + f.Comment.Text())
				line := fset.Position(f.Pos()).Line
				for _, n := range f.Names {
					if text == "" && line == prevLine+1 && mentions(prev, n.Name) {
						text = prev // a block's comment covers the fields under it it names
					}
					td.fields[n.Name] = text
				}
				prev, prevLine = text, fset.Position(f.End()).Line
			}
			docs[t.Name] = td
		}
	}
	return docs, nil
}

// paragraphs reflows a doc comment: its lines joined, its blank lines kept
// as paragraph breaks.
func paragraphs(text string) []string {
	var ps []string
	for _, p := range strings.Split(strings.TrimSpace(text), "\n\n") {
		if p = strings.Join(strings.Fields(p), " "); p != "" {
			ps = append(ps, p)
		}
	}
	return ps
}

// mentions reports whether doc has the Go name name as a word.
func mentions(doc, name string) bool {
	for _, w := range strings.FieldsFunc(doc, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if w == name {
			return true
		}
	}
	return false
}
