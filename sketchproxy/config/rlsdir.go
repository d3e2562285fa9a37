package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// envoy_rls.directory: a directory of envoyproxy/ratelimit files, loaded
// whole at every load, as envoyproxy/ratelimit loads its runtime directory.
// A Kubernetes ConfigMap mounted there is a set of symlinks (NAME ->
// ..data/NAME) and a ..data symlink that the kubelet swaps to a new
// timestamped directory in one rename: the links are followed, the dot
// entries skipped, so every load sees one version of the ConfigMap.
// cmd/sketchproxy compares RLSDirectoryDigest every watch_every and reloads
// the whole config when it changes; a reload that fails keeps the running
// config, as SIGHUP does.

// Bounds of envoy_rls.watch_every: above a busy loop, below an hour.
const (
	minWatchEvery     = 10 * time.Millisecond
	maxWatchEvery     = time.Hour
	defaultWatchEvery = time.Second
)

// Warnings lists what validation loaded and ignored in envoy_rls's files
// (a descriptor's metadata), each with its file, line and field. It is
// empty before validation.
func (r *EnvoyRLSConfig) Warnings() []string {
	if r == nil {
		return nil
	}
	return r.warnings
}

// warn records that the field at path p of c's document was loaded and is
// ignored.
func (r *RLS) warn(c *Config, p []any) {
	msg := "ignored: nothing reads a descriptor's metadata (envoy_rls.response_dynamic_metadata returns the call's domain, descriptors and quota violations, not this field); the descriptor's limit applies as written"
	r.warned = append(r.warned, c.errAt(msg, p...).Error())
}

// rlsPath resolves a path of the envoy_rls section: relative paths are
// relative to the config file's directory.
func (c *Config) rlsPath(p string) string {
	if p == "" || filepath.IsAbs(p) || c.src == "" {
		return p
	}
	return filepath.Join(filepath.Dir(c.src), p)
}

// loadRLSDirectory checks watch_every and compiles every file of
// envoy_rls.directory into b.
func (c *Config) loadRLSDirectory(b *RLS) error {
	r := c.EnvoyRLS
	if r.WatchEvery == 0 {
		r.WatchEvery = Duration(defaultWatchEvery)
	}
	if w := time.Duration(r.WatchEvery); w < minWatchEvery || w > maxWatchEvery {
		return c.errAt(fmt.Sprintf("%v: want %v to %v", w, minWatchEvery, maxWatchEvery), "envoy_rls", "watch_every")
	}
	if r.Directory == "" {
		return nil
	}
	files, err := readRLSDir(c.rlsPath(r.Directory))
	if err != nil {
		return c.errAt(err.Error(), "envoy_rls", "directory")
	}
	b.digest = files.digest
	for i, path := range files.paths {
		fc, d, err := parseRLSFile(path, files.data[i])
		if err != nil {
			return err
		}
		if err := b.compile(fc, d); err != nil {
			return err
		}
	}
	return nil
}

// rlsDir is what one look at an envoy_rls directory read: its files'
// paths and contents, and their digest.
type rlsDir struct {
	paths  []string
	data   [][]byte
	digest string
}

// readRLSDir reads every configuration file of dir (rlsDirFiles). A file
// removed between the listing and its reading is left out: the swap that
// removed it is complete, and the next look sees it gone.
func readRLSDir(dir string) (*rlsDir, error) {
	paths, err := rlsDirFiles(dir)
	if err != nil {
		return nil, err
	}
	d := &rlsDir{}
	h := sha256.New()
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		d.paths, d.data = append(d.paths, path), append(d.data, data)
		rel, _ := filepath.Rel(dir, path) // a file moved to a subdirectory is a change
		fmt.Fprintf(h, "%s\x00%d\x00", rel, len(data))
		h.Write(data)
	}
	d.digest = hex.EncodeToString(h.Sum(nil))
	return d, nil
}

// rlsDirFiles lists the configuration files of an envoy_rls directory, in
// path order: every regular file in it and in its subdirectories, whatever
// its extension, as envoyproxy/ratelimit's runtime loader (goruntime's
// filepath.Walk) reads its directory. Names starting with "." are skipped,
// files and directories, as theirs with RUNTIME_IGNOREDOTFILES=true: a
// ConfigMap's ..data and ..TIMESTAMP hold a second copy of every file
// (theirs, by default, loads dot names too). Symlinks to files are
// followed; symlinks to directories are not descended, as filepath.Walk
// does not; links that lead nowhere are skipped: a ConfigMap removes a
// file's link just after the swap that removed the file.
func rlsDirFiles(dir string) ([]string, error) {
	if st, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no such directory: create it, or set envoy_rls.directory to the directory of your envoyproxy/ratelimit files", dir)
	} else if err == nil && !st.IsDir() {
		return nil, fmt.Errorf("%s is a file, not a directory: name it in envoy_rls.files, or give its directory", dir)
	}
	var files []string
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if path != dir && errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walked: the next look sees it gone
			}
			return err
		}
		if path == dir {
			return nil
		}
		if strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case e.Type().IsRegular():
			files = append(files, path)
		case e.Type()&fs.ModeSymlink != 0:
			st, err := os.Stat(path) // follows the link
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if st.Mode().IsRegular() {
				files = append(files, path)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	return files, nil
}

// RLSDirectoryDigest is a digest of what loading envoy_rls.directory
// would read now: the names of its configuration files and their contents.
// It changes when a file is added, removed, edited or swapped in by a
// symlink, and only then. Without a directory it is "".
func (c *Config) RLSDirectoryDigest() (string, error) {
	if c.EnvoyRLS == nil || c.EnvoyRLS.Directory == "" {
		return "", nil
	}
	d, err := readRLSDir(c.rlsPath(c.EnvoyRLS.Directory))
	if err != nil {
		return "", err
	}
	return d.digest, nil
}

// LoadedDirectoryDigest is the RLSDirectoryDigest of what validation read
// from envoy_rls.directory: where the two differ, the directory changed
// since. It is "" before validation and without a directory.
func (r *EnvoyRLSConfig) LoadedDirectoryDigest() string {
	if r == nil {
		return ""
	}
	return r.digest
}
