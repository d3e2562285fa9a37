package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// binDir holds the epochsketch binary that the tests run as a user would:
// built once per test process, on first use, and removed by TestMain.
var (
	binDir   string
	binOnce  sync.Once
	binPath  string
	binBuild error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "epochsketch-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBin returns the epochsketch binary, building it on the first call.
func buildBin(t *testing.T) string {
	t.Helper()
	// The binary is built without -race: under it, the race detector
	// would check nothing but the test's own bookkeeping.
	skipUnderRace(t)
	binOnce.Do(func() {
		binPath = filepath.Join(binDir, "epochsketch")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binBuild = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binBuild != nil {
		t.Fatal(binBuild)
	}
	return binPath
}

// childOutput is a running binary's standard output and error, one pipe,
// read line by line, so that a test waits for the line it needs instead of
// polling a buffer.
type childOutput struct {
	lines chan string
	seen  []string
}

// watch starts cmd with its standard output and error on one pipe.
func watch(t *testing.T, cmd *exec.Cmd) *childOutput {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w // *os.File: the child writes the pipe itself
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close() // the child holds the only writer: its exit ends the lines
	o := &childOutput{lines: make(chan string, 64)}
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			o.lines <- sc.Text()
		}
		close(o.lines)
	}()
	return o
}

// waitFor reads lines until one matches re and returns the match; it fails
// the test after 10 s or at the end of the output.
func (o *childOutput) waitFor(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case line, ok := <-o.lines:
			if !ok {
				t.Fatalf("the output ended without %s: %q", re, o.String())
			}
			o.seen = append(o.seen, line)
			if m := re.FindString(line); m != "" {
				return m
			}
		case <-deadline:
			t.Fatalf("no %s after 10 s: %q", re, o.String())
		}
	}
}

// rest reads the output to its end (call it after the child exits) and
// returns all of it.
func (o *childOutput) rest() string {
	for line := range o.lines {
		o.seen = append(o.seen, line)
	}
	return o.String()
}

// String is the output read so far.
func (o *childOutput) String() string { return strings.Join(o.seen, "\n") }
