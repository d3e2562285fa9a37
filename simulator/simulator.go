// Package simulator serves the in-browser EpochSketch simulator: one HTML
// page, Go's wasm_exec.js and the real epochsketch package compiled to
// WebAssembly with its trace hooks on (./wasm). The three files are embedded,
// so `epochsketch simulator` needs no network and no Go toolchain; they are
// also a plain folder that any static file server can serve.
//
// After changing the package or ./wasm, rebuild the WebAssembly with
//
//	go generate ./simulator
//
// TestWasmUpToDate fails while the committed build is stale.
package simulator

//go:generate go run ./build

import (
	"embed"
	"io/fs"
	"net/http"
)

// Page is the simulator's page, relative to the served folder.
const Page = "epochsketch-simulator.html"

// Files are the files the page needs.
var Files = []string{Page, "wasm_exec.js", "epochsketch.wasm", favicon}

// favicon is the page's icon (its <link rel="icon">); Handler also serves
// it at /favicon.ico, where browsers and tools look without a link.
const favicon = "favicon.svg"

//go:embed epochsketch-simulator.html wasm_exec.js epochsketch.wasm favicon.svg
var files embed.FS

// FS returns the embedded simulator folder.
func FS() fs.FS { return files }

// Handler serves fsys (FS, or a folder built by ./build) with the page at
// "/". Nothing is cached, so a rebuilt folder shows at the next reload.
func Handler(fsys fs.FS) http.Handler {
	fileServer := http.FileServerFS(fsys)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: the simulator serves GET and HEAD", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		switch r.URL.Path {
		case "/":
			http.ServeFileFS(w, r, fsys, Page)
			return
		case "/favicon.ico":
			http.ServeFileFS(w, r, fsys, favicon)
			return
		}
		fileServer.ServeHTTP(w, r)
	})
}
