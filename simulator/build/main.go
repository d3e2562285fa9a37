// Command build compiles the simulator's WebAssembly (the real epochsketch
// package with -tags epochsketch_trace) and copies the toolchain's
// wasm_exec.js next to it. Run from the simulator folder by go generate, or
// with -o DIR to build a fresh folder elsewhere (the end-to-end test does).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

func main() {
	out := flag.String("o", ".", "folder to write epochsketch.wasm and wasm_exec.js into")
	flag.Parse()
	if err := build(*out); err != nil {
		fmt.Fprintln(os.Stderr, "simulator build:", err)
		os.Exit(1)
	}
}

// Flags are the go build flags of the committed WebAssembly: -trimpath makes
// the output the same on every machine with the same Go version, and
// -buildvcs=false keeps the commit out of it.
var Flags = []string{"-trimpath", "-buildvcs=false", "-tags", "epochsketch_trace", "-ldflags", "-s -w"}

func build(out string) error {
	// The module root holds go.mod; this command runs from simulator/ or below.
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/epochsketch/epochsketch").Output()
	if err != nil {
		return fmt.Errorf("finding the module root with go list: %v", err)
	}
	dir := strings.TrimSpace(string(root))
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append([]string{"build"}, Flags...)
	args = append(args, "-o", filepath.Join(out, "epochsketch.wasm"), "./simulator/wasm")
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build ./simulator/wasm: %v", err)
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return fmt.Errorf("go env GOROOT: %v", err)
	}
	js, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(goroot)), "lib", "wasm", "wasm_exec.js"))
	if err != nil {
		return fmt.Errorf("reading the toolchain's wasm_exec.js (Go 1.24 or later keeps it in lib/wasm): %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, "wasm_exec.js"), js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "GOVERSION"), []byte(runtime.Version()+"\n"), 0o644)
}
