package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

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

// Access log fields are read as fields: the user agent is the ninth field
// even when nginx appends X-Forwarded-For after it, and an escaped quote
// inside it does not cut it; -key path drops the query, -key uri keeps it.
func TestBinaryTopAccessLogFields(t *testing.T) {
	bin := buildBin(t)
	line := func(ip, uri, ua string) string {
		return ip + ` - - [02/Dec/2026:10:00:00 +0000] "GET ` + uri + ` HTTP/1.1" 200 5 "-" "` + ua + `" "203.0.113.9"` + "\n"
	}
	var in strings.Builder
	for range 3 {
		in.WriteString(line("10.0.0.1", "/a?x=1", `Mozilla/5.0 (\"quoted\" build)`))
	}
	in.WriteString(line("10.0.0.2", "/a?x=2", "curl/8"))
	for _, c := range []struct{ key, want string }{
		{"ua", `1     Mozilla/5.0 ("quoted" build)  3`},
		{"path", "1     /a   4"},
		{"uri", "1     /a?x=1  3"},
	} {
		out, errs, code := runBin(t, bin, []byte(in.String()), "top", "-format", "combined", "-key", c.key, "-k", "1", "-tick", "1h")
		if code != 0 || !strings.Contains(out, c.want) || !strings.Contains(out, "0 malformed") {
			t.Errorf("-key %s: exit %d\n%s%s\nwant %q", c.key, code, out, errs, c.want)
		}
	}
}

// Flags the format ignores are usage errors (exit 2), not silently
// malformed lines.
func TestBinaryTopUsageErrors(t *testing.T) {
	bin := buildBin(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"top", "-format", "clf", "-key", "ua"}, "-key ua needs -format combined"},
		{[]string{"top", "-key", "ip"}, "-key applies to -format clf or combined"},
		{[]string{"top", "-field", "user"}, "-field applies to -format json"},
		{[]string{"top", "-format", "combined", "-time-field", "ts"}, "-time-field applies to -format json"},
		{[]string{"top", "-time-format", "2006"}, "-time-format applies to records with times"},
	} {
		if _, errs, code := runBin(t, bin, nil, c.args...); code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d %q, want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

// Times: Python's http.server log needs -time-format, and without it every
// line is malformed, which is said on standard error with exit 1; JSON
// epochs in milliseconds, microseconds and nanoseconds are told apart.
func TestBinaryTopTimes(t *testing.T) {
	bin := buildBin(t)
	py := strings.Repeat(`127.0.0.1 - - [02/Dec/2026 10:00:00] "GET / HTTP/1.1" 200 -`+"\n", 5)
	if _, errs, code := runBin(t, bin, []byte(py), "top", "-format", "clf"); code != 1 || !strings.Contains(errs, "all 5 non-empty lines were malformed; the first, -:1, bad time") {
		t.Errorf("Python's log without -time-format: exit %d %s", code, errs)
	}
	if out, errs, code := runBin(t, bin, []byte(py), "top", "-format", "clf", "-time-format", "02/Jan/2006 15:04:05"); code != 0 || !regexpMatch(out, `127\.0\.0\.1\s+5\s`) {
		t.Errorf("with -time-format: exit %d %s %s", code, out, errs)
	}
	// One record a day apart in each unit, a 1-hour tick: the later record
	// finds the earlier one decayed to 0 if the unit was read right.
	for _, unit := range []struct{ name, a, b string }{
		{"s", "1764669600", "1764756000"},
		{"ms", "1764669600000", "1764756000000"},
		{"µs", "1764669600000000", "1764756000000000"},
		{"ns", "1764669600000000000", "1764756000000000000"},
	} {
		in := `{"k":"x","ts":` + unit.a + "}\n" + `{"k":"x","ts":` + unit.b + "}\n"
		out, errs, code := runBin(t, bin, []byte(in), "top", "-format", "json", "-field", "k", "-time-field", "ts", "-tick", "1h", "-json")
		if code != 0 || !strings.Contains(out, `"key":"x","estimate":1,`) || !strings.Contains(out, `"in_top_since":"2025-12-03T10:00:00Z"`) {
			t.Errorf("epoch in %s: exit %d %s %s", unit.name, code, out, errs)
		}
	}
}

// The same input gives the same answer: lines without times do not decay
// by the wall clock unless -live, however slowly they are read.
func TestBinaryTopDeterministic(t *testing.T) {
	bin := buildBin(t)
	var in strings.Builder
	for i := range 200_000 {
		in.WriteString([]string{"the", "and", "of", "x" + strconv.Itoa(i%5000)}[i%4] + "\n")
	}
	first, _, _ := runBin(t, bin, []byte(in.String()), "top", "-json", "-k", "3")
	for range 2 {
		if again, _, _ := runBin(t, bin, []byte(in.String()), "top", "-json", "-k", "3"); again != first {
			t.Fatalf("two runs on the same input differ:\n%s\n%s", first, again)
		}
	}
	if !strings.Contains(first, `{"key":"and","estimate":50000,"previous":0}`) || strings.Contains(first, "in_top_since") {
		t.Errorf("not an exact count without decay, or a time without one: %s", first)
	}
}

// Ctrl-C is heard while standard input is quiet, and the state is saved.
func TestBinaryTopInterruptOnQuietInput(t *testing.T) {
	bin := buildBin(t)
	state := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(bin, "top", "-live", "-state", state)
	pr, pw, err := os.Pipe() // nothing is ever written: a quiet input
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	defer pr.Close()
	cmd.Stdin = pr // an *os.File: the child reads it, no copying goroutine
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "final after 0 lines") {
			t.Errorf("after Ctrl-C: %v\n%s", err, out.String())
		}
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("Ctrl-C ignored while standard input is quiet")
	}
	if _, err := os.Stat(state); err != nil {
		t.Errorf("no state saved on Ctrl-C: %v", err)
	}
}

// A closed standard output (| head -1) still leaves the state file, and a
// resumed run reads a file on from where it stopped: the same file again
// counts nothing twice, an appended file counts only what was added, and a
// file that changed otherwise is refused.
func TestBinaryTopStateAndResume(t *testing.T) {
	bin := buildBin(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "keys.txt")
	var in strings.Builder
	for i := range 300_000 {
		in.WriteString([]string{"a", "b", "c"}[i%3] + "\n")
	}
	os.WriteFile(data, []byte(in.String()), 0o644)
	for i := range 3 {
		state := filepath.Join(dir, fmt.Sprint("piped", i))
		sh := exec.Command("sh", "-c", fmt.Sprintf("%s top -every 1000 -state %s %s | head -1", bin, state, data))
		if out, err := sh.CombinedOutput(); err != nil {
			t.Fatalf("| head -1: %v %s", err, out)
		}
		if _, err := os.Stat(state); err != nil {
			t.Errorf("run %d: standard output closed early and no state was saved: %v", i+1, err)
		}
	}
	state := filepath.Join(dir, "state")
	report := func(args ...string) (Report, string, int) {
		out, errs, code := runBin(t, bin, nil, append([]string{"top", "-json", "-state", state}, args...)...)
		var r Report
		if code == 0 {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
		}
		return r, errs, code
	}
	r1, _, _ := report(data)
	r2, errs, _ := report(data)
	if r2.Lines != 300_000 || topString(r2) != topString(r1) || !strings.Contains(errs, "resumed") {
		t.Errorf("the same file again: %d lines, %s against %s (%s)", r2.Lines, topString(r2), topString(r1), errs)
	}
	f, _ := os.OpenFile(data, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString(strings.Repeat("z\n", 150_000))
	f.Close()
	r3, _, _ := report(data)
	if r3.Lines != 450_000 || !strings.HasPrefix(topString(r3), "z=150000 ") {
		t.Errorf("an appended file: %d lines, top %s", r3.Lines, topString(r3))
	}
	os.WriteFile(data, []byte("changed\n"+in.String()), 0o644)
	if _, errs, code := report(data); code != 1 || !strings.Contains(errs, "keys.txt changed since -state was saved") {
		t.Errorf("a changed file: exit %d %s", code, errs)
	}
}
