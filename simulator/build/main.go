// Command build compiles the simulator's WebAssembly (the real epochsketch
// package with -tags epochsketch_trace) and copies the toolchain's
// wasm_exec.js next to it. Run from the simulator folder by go generate, or
// with -o DIR to build a fresh folder elsewhere (the end-to-end test does).
// Beside them it writes GOVERSION, the Go that built them, and SOURCES, a
// digest of the Go files compiled in, which any Go version can recompute
// (-sources prints it): TestWasmUpToDate compares it when the bytes cannot be.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
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
	sources := flag.Bool("sources", false, "print the digest of the Go files the WebAssembly compiles, and build nothing")
	flag.Parse()
	var err error
	if *sources {
		var d string
		if d, err = digest(); err == nil {
			fmt.Println(d)
		}
	} else {
		err = build(*out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "simulator build:", err)
		os.Exit(1)
	}
}

// moduleRoot is the folder that holds the library's go.mod; this command
// runs from simulator/ or below.
func moduleRoot() (string, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/epochsketch/epochsketch").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root with go list: %v", err)
	}
	return strings.TrimSpace(string(root)), nil
}

// wasmEnv is the environment of the WebAssembly build.
var wasmEnv = append(os.Environ(), "GOOS=js", "GOARCH=wasm", "CGO_ENABLED=0")

// digest is a SHA-256 over the name and content of every Go file outside
// the standard library that the WebAssembly compiles, in go list's order:
// what the build turns into the committed bytes, whatever the Go version.
func digest() (string, error) {
	dir, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-deps", "-tags", "epochsketch_trace",
		"-f", `{{if not .Standard}}{{$d := .Dir}}{{$p := .ImportPath}}{{range .GoFiles}}{{$p}} {{$d}}/{{.}}{{"\n"}}{{end}}{{end}}`, "./simulator/wasm")
	cmd.Dir, cmd.Env, cmd.Stderr = dir, wasmEnv, os.Stderr
	list, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list ./simulator/wasm: %v", err)
	}
	h := sha256.New()
	sc := bufio.NewScanner(bytes.NewReader(list))
	for sc.Scan() {
		pkg, path, _ := strings.Cut(sc.Text(), " ")
		src, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s/%s %d\n", pkg, filepath.Base(path), len(src))
		h.Write(src)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil)), nil
}

// Flags are the go build flags of the committed WebAssembly: -trimpath makes
// the output the same on every machine with the same Go version, and
// -buildvcs=false keeps the commit out of it.
var Flags = []string{"-trimpath", "-buildvcs=false", "-tags", "epochsketch_trace", "-ldflags", "-s -w"}

func build(out string) error {
	dir, err := moduleRoot()
	if err != nil {
		return err
	}
	out, err = filepath.Abs(out)
	if err != nil {
		return err
	}
	args := append([]string{"build"}, Flags...)
	args = append(args, "-o", filepath.Join(out, "epochsketch.wasm"), "./simulator/wasm")
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = wasmEnv
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
	d, err := digest()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "SOURCES"), []byte(d+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "GOVERSION"), []byte(runtime.Version()+"\n"), 0o644)
}
