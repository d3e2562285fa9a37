// Command reqfiles counts the source files of SketchProxy that one request
// through Middleware.ServeHTTP runs code in, once the middleware is built:
// how many places a reader follows a request through. It reads its own
// coverage counters, so it must be built with them:
//
//	go build -cover -covermode=atomic -coverpkg=./... -o /tmp/reqfiles ./internal/reqfiles
//	GOCOVERDIR=$(mktemp -d) /tmp/reqfiles -max 8
//
// (scripts/request-files.sh does both; make test-sketchproxy runs it). An
// admitted request and a refused one are each counted alone. It exits 1 if
// either ran in more than -max files.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/coverage"
	"sort"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

const module = "github.com/epochsketch/epochsketch/sketchproxy/"

func main() {
	most := flag.Int("max", 0, "exit 1 if a request runs in more files than this (0: no limit)")
	flag.Parse()
	if err := run(*most); err != nil {
		fmt.Fprintln(os.Stderr, "reqfiles:", err)
		os.Exit(1)
	}
}

func run(most int) error {
	cfg, err := sketchproxy.ParseConfig("reqfiles", []byte(`rules:
  - name: api
    key: ["header:X-Key"]
    limits: [{requests: 2, per: 24h}]
`))
	if err != nil {
		return err
	}
	mw, err := sketchproxy.New(cfg, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		sketchproxy.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer mw.Close()
	bad := false
	for _, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if err := coverage.ClearCounters(); err != nil {
			return fmt.Errorf("%v (build with -cover -covermode=atomic -coverpkg=./...)", err)
		}
		r := httptest.NewRequest("GET", "/v1/x", nil)
		r.Header.Set("X-Key", "k")
		w := httptest.NewRecorder()
		mw.ServeHTTP(w, r)
		if w.Code != want {
			return fmt.Errorf("status %d, want %d", w.Code, want)
		}
		files, err := ranFiles()
		if err != nil {
			return err
		}
		fmt.Printf("status %d: %d files: %s\n", want, len(files), strings.Join(files, " "))
		if most > 0 && len(files) > most {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("a request ran in more than %d files", most)
	}
	return nil
}

// ranFiles writes the coverage counters and returns this module's files
// with a statement that ran since they were cleared (this command's own
// excluded).
func ranFiles() ([]string, error) {
	dir, err := os.MkdirTemp("", "reqfiles")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := coverage.WriteMetaDir(dir); err != nil {
		return nil, err
	}
	if err := coverage.WriteCountersDir(dir); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "cover.txt")
	if b, err := exec.Command("go", "tool", "covdata", "textfmt", "-i", dir, "-o", out).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go tool covdata: %v: %s", err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name.go:line.col,line.col statements count
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 || fields[2] == "0" {
			continue
		}
		name := fields[0][:strings.LastIndex(fields[0], ":")]
		if strings.HasPrefix(name, module) && !strings.HasPrefix(name, module+"internal/reqfiles/") {
			seen[strings.TrimPrefix(name, module)] = true
		}
	}
	files := make([]string, 0, len(seen))
	for n := range seen {
		files = append(files, n)
	}
	sort.Strings(files)
	return files, sc.Err()
}
