// Package atomicfile writes files crash-safely: the library's snapshot files
// (Sketch.SaveFile), the epochsketch command's state and SketchProxy's
// state file. It is no part of the sketch's API, a general helper with one
// function; it is public only because SketchProxy, a module of its own,
// cannot import the library's internal packages, and one writer is tested
// once.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write writes path through write so that a crash at any point
// leaves either the old file or the new one, whole: it writes a temporary
// file in the same directory, syncs it, renames it over path, and syncs the
// directory.
func Write(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = write(f); err != nil {
		return err
	}
	if err = f.Chmod(perm); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
