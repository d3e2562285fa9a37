package atomicfile_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/epochsketch/epochsketch/atomicfile"
)

// write writes s to path through Write, then fails with err if not nil.
func write(path, s string, err error) error {
	return atomicfile.Write(path, 0o600, func(w io.Writer) error {
		if _, werr := io.WriteString(w, s); werr != nil {
			return werr
		}
		return err
	})
}

// TestWrite: a new file and a replaced one hold what was written, readable
// by their owner only, and no temporary file stays beside them.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	for _, s := range []string{"the first", "the second, longer than the first"} {
		if err := write(p, s, nil); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != s {
			t.Fatalf("read %q, %v; want %q", b, err, s)
		}
	}
	if fi, err := os.Stat(p); err != nil || (runtime.GOOS != "windows" && fi.Mode().Perm() != 0o600) {
		t.Errorf("mode %v, %v; want -rw-------", fi.Mode(), err)
	}
	if m, _ := os.ReadDir(dir); len(m) != 1 {
		t.Errorf("%d files in the directory, want the file alone", len(m))
	}
}

// TestWriteFails: a write that fails leaves the old file whole and no
// temporary file, and returns the writer's error; a directory that does
// not exist is fs.ErrNotExist. A writer killed mid-write leaves
// the old file too: the library's TestSaveFileSurvivesAKilledWriter.
func TestWriteFails(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state")
	if err := write(p, "old", nil); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := write(p, "half of the new", boom); !errors.Is(err, boom) {
		t.Fatalf("Write returned %v, want the writer's error", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old one", b)
	}
	if m, _ := os.ReadDir(dir); len(m) != 1 {
		t.Errorf("%d files in the directory after a failed write, want the old one alone", len(m))
	}
	missing := filepath.Join(dir, "no", "state")
	if err := write(missing, "x", nil); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing directory: %v, want fs.ErrNotExist", err)
	}
}
