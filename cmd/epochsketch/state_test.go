package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func finalReport(t *testing.T, args ...string) Report {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append([]string{"top", "-json"}, args...), strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r Report
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func topString(r Report) string {
	var s []string
	for _, e := range r.Top {
		s = append(s, fmt.Sprintf("%s=%d", e.Key, e.Estimate))
	}
	return strings.Join(s, " ")
}

// A replay cut in two and resumed from -state ends where one run over the
// whole stream does, for a replay clock and for records' own times.
func TestTopResumesFromState(t *testing.T) {
	dir := t.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.2, 1, 999)
	var all []string
	for range 20_000 {
		all = append(all, fmt.Sprint("user", z.Uint64()))
	}
	nginx, err := os.ReadFile("testdata/nginx-access.log")
	if err != nil {
		t.Fatal(err)
	}
	logLines := strings.SplitAfter(strings.TrimSuffix(string(nginx), "\n"), "\n")
	for _, c := range []struct {
		name  string
		lines []string
		cut   int
		args  []string
	}{
		{"replay clock", all, 12_345, []string{"-lines-per-tick", "500", "-k", "10"}},
		{"record times", logLines, 300, []string{"-format", "combined", "-key", "ip", "-tick", "1s", "-k", "3"}},
	} {
		whole := filepath.Join(dir, c.name+"-whole")
		a := filepath.Join(dir, c.name+"-a")
		b := filepath.Join(dir, c.name+"-b")
		join := func(l []string) []byte {
			var b strings.Builder
			for _, x := range l {
				b.WriteString(strings.TrimSuffix(x, "\n") + "\n")
			}
			return []byte(b.String())
		}
		os.WriteFile(whole, join(c.lines), 0o644)
		os.WriteFile(a, join(c.lines[:c.cut]), 0o644)
		os.WriteFile(b, join(c.lines[c.cut:]), 0o644)
		state := filepath.Join(dir, c.name+".state")
		want := finalReport(t, append(c.args, whole)...)
		first := finalReport(t, append(c.args, "-state", state, a)...)
		got := finalReport(t, append(c.args, "-state", state, b)...)
		if first.Lines != c.cut || got.Lines != len(c.lines) {
			t.Errorf("%s: lines %d then %d, want %d then %d", c.name, first.Lines, got.Lines, c.cut, len(c.lines))
		}
		if topString(got) != topString(want) || topString(got) == "" {
			t.Errorf("%s: resumed top\n  %s\nwhole run\n  %s", c.name, topString(got), topString(want))
		}
		if st, _ := os.Stat(state); st.Mode().Perm() != 0o600 {
			t.Errorf("%s: the state file is %v, want 0600", c.name, st.Mode().Perm())
		}
	}
}

func TestTopStateErrors(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	os.WriteFile(in, []byte("a\nb\na\n"), 0o644)
	state := filepath.Join(dir, "s")
	finalReport(t, "-state", state, in)
	for _, c := range []struct {
		name string
		prep func()
		args []string
		want string
	}{
		{"other buckets", func() {}, []string{"-buckets", "1024"}, "saved with -format lines -key ip -buckets 65536"},
		{"damaged", func() {
			b, _ := os.ReadFile(state)
			b[len(b)-30] ^= 1
			os.WriteFile(state, b, 0o600)
		}, nil, "delete the file to start empty"},
		{"foreign", func() { os.WriteFile(state, []byte("hello"), 0o600) }, nil, "not an epochsketch top state file"},
	} {
		c.prep()
		var errb bytes.Buffer
		code := run(append(append([]string{"top", "-state", state}, c.args...), in), strings.NewReader(""), &bytes.Buffer{}, &errb)
		if code == 0 || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d, %q; want an error with %q", c.name, code, errb.String(), c.want)
		}
	}
}
