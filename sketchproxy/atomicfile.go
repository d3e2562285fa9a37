package sketchproxy

import (
	"io"
	"os"
	"path/filepath"
)

// writeFileAtomic writes path through write so that a crash at any point
// leaves either the old state file or the new one, whole: a temporary file
// in the same directory, synced, renamed over path, then the directory
// synced. The library keeps its own copy internal (a general helper is not
// its API), and no module imports another's internal packages.
func writeFileAtomic(path string, perm os.FileMode, write func(io.Writer) error) (err error) {
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
