// Command configref writes SketchProxy's configuration reference,
// docs/configuration.md, from the Config types themselves: every field the
// YAML file can set, with its type, its default, whether a change takes a
// restart, and an example.
//
//	go generate ./...            (from sketchproxy/, as configapi.go asks)
//	go run ./internal/configref -o docs/configuration.md
//
// Descriptions are the fields' doc comments, read from the package's
// source with go/parser and go/doc. Defaults are read off configs prepared
// by the real defaulting code (config.Parse), never restated: a
// default that differs between the prepared skeletons depends on other
// settings, and the reference sends the reader to the description.
// Restart-only settings come from the reload tag (config.ReloadTag),
// examples from the example tag. TestReferenceUpToDate fails when the page
// is stale or a field lacks a description or an example.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

func main() {
	out := flag.String("o", "docs/configuration.md", "the page to write")
	src := flag.String("src", ".", "the sketchproxy module's directory (its config package is in config/)")
	flag.Parse()
	page, problems, err := generate(*src)
	if err != nil {
		fmt.Fprintf(os.Stderr, "configref: %v\n", err)
		os.Exit(1)
	}
	if err := write(*out, page); err != nil {
		fmt.Fprintf(os.Stderr, "configref: %v\n", err)
		os.Exit(1)
	}
	// The page is written even when incomplete, so that the author sees
	// where the missing words go; the exit status and the test still fail.
	for _, p := range problems {
		fmt.Fprintf(os.Stderr, "configref: %s\n", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

// write replaces the page at path with page, unless it holds it already.
func write(path string, page []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, page) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, page, 0o644)
}
