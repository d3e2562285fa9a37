package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// buildBin builds the epochsketch binary for tests that run it as a user
// would.
func buildBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "epochsketch")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// runBin runs the binary and returns its output streams and exit status.
func runBin(t *testing.T, bin string, stdin []byte, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// One bad line never costs the run: a line of 2 MiB is skipped and counted
// as malformed, and the keys around it are counted.
func TestBinaryTopLongLines(t *testing.T) {
	bin := buildBin(t)
	in := "a\na\n" + strings.Repeat("x", 2<<20) + "\na\nb\n"
	out, errs, code := runBin(t, bin, []byte(in), "top", "-show-malformed")
	if code != 0 || !strings.Contains(out, "final after 5 lines (0 empty, 1 malformed") {
		t.Fatalf("exit %d\n%s\n%s", code, out, errs)
	}
	if !strings.Contains(errs, "-:3: malformed: longer than 1048576 bytes: skipped") {
		t.Errorf("the long line was not reported: %s", errs)
	}
	if !regexpMatch(out, `(?m)^1\s+a\s+3\s`) {
		t.Errorf("a counted %s", out)
	}
}

// A missing file and a truncated gzip among several: each is reported, the
// others are read, the report is printed, and the exit status is non-zero.
func TestBinaryTopFileErrors(t *testing.T) {
	bin := buildBin(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.txt")
	os.WriteFile(good, []byte("a\na\nb\n"), 0o644)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(strings.Repeat("c\n", 5000)))
	zw.Close()
	trunc := filepath.Join(dir, "cut.gz")
	os.WriteFile(trunc, gz.Bytes()[:gz.Len()-20], 0o644)
	out, errs, code := runBin(t, bin, nil, "top", good, filepath.Join(dir, "missing.txt"), trunc)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(errs, "missing.txt: no such file") || !strings.Contains(errs, "cut.gz") || !strings.Contains(errs, "2 of 3 inputs could not be read to the end") {
		t.Errorf("errors not reported per file:\n%s", errs)
	}
	if !strings.Contains(out, "final after") || !regexpMatch(out, `(?m)^1\s+c\s`) || !regexpMatch(out, `(?m)\sa\s+2\s`) {
		t.Errorf("the report lost what was read:\n%s", out)
	}
}

// Keys reach the terminal escaped: no ESC, BEL or tab from the input is
// written raw, and a huge key is cut and marked.
func TestBinaryTopEscapesKeys(t *testing.T) {
	bin := buildBin(t)
	evil := "agent\x1b]0;pwned\x07\x1b[31mred\tcol"
	in := strings.Repeat(evil+"\n", 3) + strings.Repeat(strings.Repeat("k", 5000)+"\n", 2) + "\xff\xfe\n"
	out, errs, code := runBin(t, bin, []byte(in), "top")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "red\tcol") {
		t.Errorf("control bytes reached the terminal: %q", out)
	}
	if !strings.Contains(out, `"agent\x1b]0;pwned\a\x1b[31mred\tcol"`) {
		t.Errorf("the key is not shown escaped: %q", out)
	}
	if !strings.Contains(out, strings.Repeat("k", 1024)+"…[cut]") || strings.Contains(out, strings.Repeat("k", 1025)) {
		t.Errorf("a 5,000-byte key is not cut at 1,024 bytes and marked")
	}
	if !strings.Contains(out, `"\xff\xfe"`) {
		t.Errorf("invalid UTF-8 is not escaped: %q", out)
	}
	if _, errs, code := runBin(t, bin, nil, "top", "-k", "100000000"); code != 2 || !strings.Contains(errs, "-k 100000000: want 1 to 10000") {
		t.Errorf("-k 100000000: exit %d %s", code, errs)
	}
}

func regexpMatch(s, re string) bool { return regexp.MustCompile(re).MatchString(s) }
