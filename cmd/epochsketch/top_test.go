package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// kjvWords tokenizes the King James text in order (Debian bible-kjv). CI
// installs the package and must have it; elsewhere the test says how to get it.
func kjvWords(t *testing.T) []string {
	out, err := exec.Command("bible", "gen1:1-rev22:21").Output()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("bible-kjv is missing in CI (.ci/run installs it): %v", err)
		}
		t.Skip("needs Debian's bible-kjv: apt-get install bible-kjv")
	}
	return strings.FieldsFunc(string(bytes.ToLower(out)), func(r rune) bool { return !unicode.IsLetter(r) })
}

// The top 20 of `epochsketch top`, replaying the King James text at 10,000
// words per tick, equals the exact decayed top 20 (c = (c >> age) + 1 per
// arrival) at every checkpoint.
func TestTopMatchesExactOnKingJames(t *testing.T) {
	words := kjvWords(t)
	const perTick, every, k = 10_000, 100_000, 20
	var out bytes.Buffer
	in := strings.NewReader(strings.Join(words, "\n") + "\n")
	args := []string{"top", "-json", "-k", fmt.Sprint(k), "-lines-per-tick", fmt.Sprint(perTick), "-every", fmt.Sprint(every), "-buckets", "4096"}
	if code := run(args, in, &out, &out); code != 0 {
		t.Fatalf("exit %d: %s", code, out.String())
	}
	type ent struct {
		c    uint64
		tick int
	}
	exact := map[string]*ent{}
	at := func(e *ent, tick int) uint64 {
		if d := tick - e.tick; d < 64 {
			return e.c >> d
		}
		return 0
	}
	var want [][]string
	for i, w := range words {
		tick := i / perTick
		e := exact[w]
		if e == nil {
			e = &ent{tick: tick}
			exact[w] = e
		}
		e.c = at(e, tick) + 1
		e.tick = tick
		if (i+1)%every == 0 {
			now := (i + 1) / perTick
			type kc struct {
				k string
				c uint64
			}
			var all []kc
			for key, e := range exact {
				if c := at(e, now); c > 0 {
					all = append(all, kc{key, c})
				}
			}
			sort.Slice(all, func(a, b int) bool { return all[a].c > all[b].c || all[a].c == all[b].c && all[a].k < all[b].k })
			var top []string
			for _, x := range all[:k] {
				top = append(top, fmt.Sprintf("%s=%d", x.k, x.c))
			}
			want = append(want, top)
		}
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	checkpoint := 0
	for sc.Scan() {
		var r Report
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad JSON line %q: %v", sc.Text(), err)
		}
		if r.Final {
			continue
		}
		var got []string
		for _, e := range r.Top {
			got = append(got, fmt.Sprintf("%s=%d", e.Key, e.Estimate))
		}
		if strings.Join(got, " ") != strings.Join(want[checkpoint], " ") {
			t.Errorf("checkpoint at line %d:\n got %v\nwant %v", r.Lines, got, want[checkpoint])
		}
		checkpoint++
	}
	if checkpoint != len(want) || checkpoint < 5 {
		t.Fatalf("%d checkpoints, want %d (at least 5)", checkpoint, len(want))
	}
}

// The built binary, used as a user would: standard input, a gzip file, a
// missing file, a bad flag.
func TestBinaryEndToEnd(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "epochsketch")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	gz := filepath.Join(dir, "keys.gz")
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	fmt.Fprint(zw, "x\ny\nx\nx\n")
	zw.Close()
	if err := os.WriteFile(gz, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args   []string
		stdin  string
		code   int
		output string
	}{
		{[]string{"top", "-k", "1"}, "a\nb\na\n", 0, "1     a    2"},
		{[]string{"top", "-k", "1", gz}, "", 0, "1     x    3"},
		{[]string{"top", filepath.Join(dir, "missing.log")}, "", 1, "missing.log: no such file"},
		{[]string{"top", "-k", "zero"}, "", 2, `invalid value "zero" for flag -k`},
		{[]string{"ticks", "-tick", "1h"}, "", 0, "2.3 k/s"},
	} {
		cmd := exec.Command(bin, c.args...)
		cmd.Stdin = strings.NewReader(c.stdin)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || !strings.Contains(string(out), c.output) {
			t.Errorf("%v: exit %d, output %q; want exit %d with %q", c.args, code, out, c.code, c.output)
		}
	}
}
