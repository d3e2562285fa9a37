package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// -h, -help, --help and help list every command, and each command's line
// in that list names every flag its own -h describes.
func TestBinaryHelpListsEveryCommandAndFlag(t *testing.T) {
	bin := buildBin(t)
	commands := []string{"demo", "size", "ticks", "top", "sim", "simulator"}
	for _, h := range []string{"-h", "-help", "--help", "help"} {
		out, errs, code := runBin(t, bin, nil, h)
		if code != 0 {
			t.Fatalf("epochsketch %s: exit %d %s", h, code, errs)
		}
		for _, c := range commands {
			if !strings.Contains(out, "  epochsketch "+c+" ") {
				t.Errorf("epochsketch %s does not list %s:\n%s", h, c, out)
			}
		}
	}
	list, _, _ := runBin(t, bin, nil, "help")
	flagLine := regexp.MustCompile(`(?m)^  -([a-z-]+)`)
	for _, c := range commands {
		// The command's entry: from its line to the next command's.
		entry := list[strings.Index(list, "  epochsketch "+c+" "):]
		if next := strings.Index(entry[1:], "\n  epochsketch "); next >= 0 {
			entry = entry[:next+1]
		}
		_, flags, code := runBin(t, bin, nil, c, "-h")
		if code != 0 {
			t.Fatalf("epochsketch %s -h: exit %d", c, code)
		}
		for _, m := range flagLine.FindAllStringSubmatch(flags, -1) {
			if !regexp.MustCompile(`\[-` + m[1] + `[ \]]|-` + m[1] + ` `).MatchString(entry) {
				t.Errorf("epochsketch help: the %s entry lacks -%s:\n%s", c, m[1], entry)
			}
		}
	}
	if out, _, code := runBin(t, bin, nil, "help", "top"); code != 0 || !strings.Contains(out, "-time-format") {
		t.Errorf("epochsketch help top: exit %d %s", code, out)
	}
}

// A state saved at one -k resumes at another: the report keeps the
// heaviest keys, with the counts from before, and -k larger than before
// resumes too.
func TestBinaryTopResumesAtAnotherK(t *testing.T) {
	bin := buildBin(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "keys.txt")
	var in strings.Builder
	for i := range 200 { // key i occurs i+1 times: k00199 is the heaviest
		in.WriteString(strings.Repeat(fmt.Sprintf("k%05d\n", i), i+1))
	}
	os.WriteFile(data, []byte(in.String()), 0o644)
	state := filepath.Join(dir, "state")
	if _, errs, code := runBin(t, bin, nil, "top", "-state", state, data); code != 0 {
		t.Fatalf("first run: exit %d %s", code, errs)
	}
	// Each run saves what it tracked (4k keys): -k 50 after -k 3 has the
	// 12 keys -k 3 kept, with their counts.
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, nil, 0o644)
	for _, c := range []struct{ k, keys int }{{3, 3}, {50, 12}, {1, 1}} {
		out, errs, code := runBin(t, bin, nil, "top", "-json", "-k", fmt.Sprint(c.k), "-state", state, empty)
		if code != 0 {
			t.Fatalf("-k %d: exit %d %s", c.k, code, errs)
		}
		var r Report
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("-k %d: %v %s", c.k, err, out)
		}
		// The TopK's entries may lag by 1/16 (README, Heavy hitters), so
		// the last kept keys are among the heaviest 12 + 200/16.
		if len(r.Top) != c.keys || r.Top[0].Key != "k00199" || r.Top[0].Estimate != 200 || r.Top[c.keys-1].Estimate < 200-12-200/16 {
			t.Errorf("-k %d: %d keys, %+v", c.k, len(r.Top), r.Top)
		}
	}
}

// startPiped starts the binary with a standard input the test writes (and
// keeps open, as tail -f does) and both outputs watched; the test's end
// kills it.
func startPiped(t *testing.T, bin string, args ...string) (*exec.Cmd, io.Writer, *childOutput) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := watch(t, cmd)
	t.Cleanup(func() { cmd.Process.Kill() })
	return cmd, stdin, out
}

// Reports say "1 line" and "1 first sighting".
func TestBinaryTopGrammar(t *testing.T) {
	bin := buildBin(t)
	out, _, _ := runBin(t, bin, []byte("a\n"), "top")
	if !strings.Contains(out, "final after 1 line (0 empty, 0 malformed, 1 first sighting)") {
		t.Errorf("%q", out)
	}
	if _, errs, code := runBin(t, bin, []byte("nope\n"), "top", "-format", "combined"); code != 1 || !strings.Contains(errs, "the only non-empty line was malformed, -:1, ") {
		t.Errorf("exit %d %q", code, errs)
	}
}

// -live to a pipe (tail -f access.log | epochsketch top -live | tee)
// appends a report every second without -refresh, as it goes, not only at
// Ctrl-C; -json makes each report one line.
func TestBinaryTopLiveToPipe(t *testing.T) {
	cmd, stdin, out := startPiped(t, buildBin(t), "top", "-live", "-json")
	fmt.Fprint(stdin, "k\nk\n") // the pipe stays open, as with tail -f
	notFinal := regexp.MustCompile(`"final":false`)
	out.waitFor(t, notFinal)
	out.waitFor(t, notFinal) // a second report, before any Ctrl-C
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	all := out.rest()
	if err != nil || !strings.Contains(all, `"final":true`) {
		t.Errorf("after Ctrl-C: %v %q", err, all)
	}
	for _, line := range strings.Split(strings.TrimSpace(all), "\n") {
		var r Report
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Errorf("not one JSON report per line: %q: %v", line, err)
		}
	}
}
