package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestSimulatorServesAndStops(t *testing.T) {
	cmd := exec.Command(buildBin(t), "simulator", "-addr", "127.0.0.1:0")
	out := watch(t, cmd)
	defer cmd.Process.Kill()
	url := out.waitFor(t, regexp.MustCompile(`http://127\.0\.0\.1:\d+/`))
	for path, want := range map[string]string{"": "EpochSketch simulator", "wasm_exec.js": "Go", "epochsketch.wasm": "\x00asm"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(want)) {
			t.Errorf("GET /%s: %d, %d bytes without %q", path, resp.StatusCode, len(b), want)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil || !strings.Contains(out.rest(), "stopped") {
		t.Fatalf("after Ctrl-C: %v: %q", err, out.String())
	}
}

func TestSimulatorExportAndBadFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sim")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"simulator", "-export", dir}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("export: exit %d: %s", code, stderr.String())
	}
	for _, f := range []string{"epochsketch-simulator.html", "wasm_exec.js", "epochsketch.wasm"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("export wrote no %s: %v", f, err)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"simulator", "-dir", filepath.Join(dir, "missing")}, 1, "the folder needs"},
		{[]string{"simulator", "-addr", "256.0.0.1:99999"}, 2, "-addr 256.0.0.1:99999"},
		{[]string{"simulator", "extra"}, 2, `unexpected argument "extra"`},
	} {
		stderr.Reset()
		if code := run(c.args, nil, io.Discard, &stderr); code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%v: exit %d, %q; want exit %d and %q", c.args, code, stderr.String(), c.code, c.want)
		}
	}
}
