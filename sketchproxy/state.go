package sketchproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/epochsketch/epochsketch/atomicfile"
)

// The state file holds every sketch (limits, budgets, new keys, bans) and
// the new-key meter, in the engine's format (internal/engine, state.go). It
// holds the sketches' hash keys: it is written 0600; keep it private.

// SaveState writes every sketch to the config's state_file, crash-safely.
// cmd/sketchproxy calls it every state_every and Close calls it last.
func (m *Middleware) SaveState() error {
	m.mu.Lock() // no reload between reading the rule set and writing it
	defer m.mu.Unlock()
	if m.savesHeld {
		return nil // a successor restored the file and saves it now
	}
	return m.saveLocked()
}

// HandOverState saves the state file for a successor process that takes
// over this one's listeners (cmd/sketchproxy's handover), then holds every
// later save, periodic or at Close: this process, which still answers the
// requests in flight, must not overwrite what the successor restored and
// saves from then on. resume lifts the hold, where the successor failed
// and this process serves on. Without a state_file it saves nothing.
func (m *Middleware) HandOverState() (resume func(), err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.saveLocked(); err != nil {
		return nil, err
	}
	m.savesHeld = true
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.savesHeld = false
	}, nil
}

// saveLocked is SaveState with m.mu held.
func (m *Middleware) saveLocked() error {
	st := m.state.Load()
	path := st.cfg.StateFile
	if path == "" {
		return nil
	}
	start := time.Now()
	n := 0
	err := atomicfile.Write(path, 0o600, func(w io.Writer) (err error) {
		n, err = m.eng.WriteState(w, st.set)
		return err
	})
	if err != nil {
		m.met.stateSaves[1].Add(1)
		return fmt.Errorf("saving the state to %s: %w", path, err)
	}
	m.met.stateSaves[0].Add(1)
	m.log.Debug("state saved", "file", path, "sketches", n, "took", time.Since(start).String())
	return nil
}

// CheckStateFile reports why path cannot be a state file, saying what and
// where: a directory, a directory that does not exist or is not one, or a
// directory this process cannot create files in (each save writes a
// temporary file beside path and renames it over path). It creates and
// removes such a file to know. "" (no state file) passes.
func CheckStateFile(path string) error {
	if path == "" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("state_file %s: is a directory: want the path of a file in it", path)
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("state_file %s: its directory %s does not exist: create it, writable by this user", path, dir)
	case err != nil:
		return fmt.Errorf("state_file %s: %v", path, err)
	case !fi.IsDir():
		return fmt.Errorf("state_file %s: %s is not a directory", path, dir)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".check-*")
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return fmt.Errorf("state_file %s: cannot create files in %s (each save writes one there and renames it over the state file): %v", path, dir, err)
	}
	f.Close()
	os.Remove(f.Name())
	return nil
}

// WriteState writes every sketch and the new-key meter to w in the state
// file's format, whether or not the config has a state_file: what a
// handover without one passes to its successor (RestoreState). Like the
// file, it holds the sketches' hash keys: keep it private.
func (m *Middleware) WriteState(w io.Writer) error {
	m.mu.Lock() // no reload between reading the rule set and writing it
	defer m.mu.Unlock()
	_, err := m.eng.WriteState(w, m.state.Load().set)
	return err
}

// RestoreState restores what WriteState wrote, as New restores the state
// file (from names the source in the log). Any error leaves every sketch
// empty, and is logged and returned.
func (m *Middleware) RestoreState(r io.Reader, from string) error {
	return m.restore(bufio.NewReaderSize(r, 1<<16), from)
}

// loadState restores the state file into the current sketches. A sketch in
// the file that the config no longer has (another tick or size) is skipped.
// Any error leaves every sketch empty: a bad file never blocks startup.
func (m *Middleware) loadState() {
	path := m.state.Load().cfg.StateFile
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		m.log.Info("no state file yet: starting empty", "file", path)
		return
	}
	if err != nil {
		m.log.Error("state file unreadable: starting empty", "file", path, "err", err.Error())
		return
	}
	defer f.Close()
	m.restore(bufio.NewReaderSize(f, 1<<16), path)
}

// restore is loadState and RestoreState from r, read from (a file's path).
func (m *Middleware) restore(r *bufio.Reader, from string) error {
	st := m.state.Load()
	sum, err := m.eng.ReadState(r, st.set)
	if err != nil {
		m.met.stateLoads[1].Add(1)
		m.log.Error("state file rejected: starting empty", "file", from, "err", err.Error())
		return err
	}
	m.met.stateLoads[0].Add(1)
	attrs := []any{"file", from, "sketches", sum.Restored, "skipped", sum.Skipped, "live_slots", sum.Live, "expired_slots", sum.Expired}
	if !sum.Saved.IsZero() { // no sketch restored, no time read
		attrs = append(attrs, "saved", sum.Saved.UTC().Format(time.RFC3339), "age", m.now().Sub(sum.Saved).Round(time.Second).String())
	}
	if sum.Skipped > 0 {
		attrs = append(attrs, "why_skipped", "a tick, burst or size the config no longer has, or a file from before SketchProxy counted 2 a request")
	}
	m.log.Info("state restored", attrs...)
	return nil
}
