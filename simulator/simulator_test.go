package simulator

import (
	"bytes"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestWasmUpToDate checks that the committed WebAssembly runs the code in
// this tree. On any Go version it recomputes the digest of the Go files the
// build compiles and compares it with the committed SOURCES; on the Go
// version that built the committed files (GOVERSION) it also rebuilds them
// and demands identical bytes, which -trimpath makes reproducible for one
// version only.
func TestWasmUpToDate(t *testing.T) {
	read := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	built, sources := read("GOVERSION"), read("SOURCES")
	out, err := exec.Command("go", "run", "./build", "-sources").Output()
	if err != nil {
		t.Fatalf("go run ./build -sources: %v", err)
	}
	if now := strings.TrimSpace(string(out)); now != sources {
		t.Fatalf("the simulator's Go source changed since simulator/epochsketch.wasm was built (SOURCES %s, now %s): run go generate ./simulator and commit the result", sources, now)
	}
	if built != runtime.Version() {
		t.Logf("the source digest matches; the committed bytes were built by %s and this is %s, so they were not rebuilt and compared", built, runtime.Version())
		return
	}
	dir := t.TempDir()
	if out, err := exec.Command("go", "run", "./build", "-o", dir).CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, f := range []string{"epochsketch.wasm", "wasm_exec.js"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f) // the committed file, beside the SOURCES it was built with
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("simulator/%s is stale: run go generate ./simulator and commit it", f)
		}
	}
}

func TestHandler(t *testing.T) {
	srv := httptest.NewServer(Handler(FS()))
	defer srv.Close()
	get := func(path string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/")
	if resp.StatusCode != 200 || !strings.Contains(body, "EpochSketch simulator") || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET /: %d %q, body has the page: %v", resp.StatusCode, resp.Header.Get("Cache-Control"), strings.Contains(body, "EpochSketch simulator"))
	}
	for _, f := range Files {
		if resp, _ := get("/" + f); resp.StatusCode != 200 {
			t.Errorf("GET /%s: %d", f, resp.StatusCode)
		}
	}
	if resp, _ := get("/epochsketch.wasm"); resp.Header.Get("Content-Type") != "application/wasm" {
		t.Errorf("the WebAssembly is served as %q: instantiateStreaming needs application/wasm", resp.Header.Get("Content-Type"))
	}
	if resp, _ := get("/nope.js"); resp.StatusCode != 404 {
		t.Errorf("GET a missing file: %d", resp.StatusCode)
	}
	post, err := http.Post(srv.URL+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed || post.Header.Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d, Allow %q", post.StatusCode, post.Header.Get("Allow"))
	}
	// Nothing the page loads comes from the network.
	page, _ := fs.ReadFile(FS(), Page)
	for _, bad := range []string{"http://", "https://", "//cdn"} {
		if bytes.Contains(page, []byte(bad)) {
			t.Errorf("the page refers to %q: it must work offline", bad)
		}
	}
}
