package sketchproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
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
	err := writeFileAtomic(path, 0o600, func(w io.Writer) (err error) {
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

// loadState restores the state file into the current sketches. A sketch in
// the file that the config no longer has (another tick or size) is skipped.
// Any error leaves every sketch empty: a bad file never blocks startup.
func (m *Middleware) loadState() {
	st := m.state.Load()
	path := st.cfg.StateFile
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
	sum, err := m.eng.ReadState(bufio.NewReaderSize(f, 1<<16), st.set)
	if err != nil {
		m.met.stateLoads[1].Add(1)
		m.log.Error("state file rejected: starting empty", "file", path, "err", err.Error())
		return
	}
	m.met.stateLoads[0].Add(1)
	attrs := []any{"file", path, "sketches", sum.Restored, "skipped", sum.Skipped, "live_slots", sum.Live, "expired_slots", sum.Expired}
	if !sum.Saved.IsZero() { // no sketch restored, no time read
		attrs = append(attrs, "saved", sum.Saved.UTC().Format(time.RFC3339), "age", m.now().Sub(sum.Saved).Round(time.Second).String())
	}
	if sum.Skipped > 0 {
		attrs = append(attrs, "why_skipped", "a tick, burst or size the config no longer has, or a file from before SketchProxy counted 2 a request")
	}
	m.log.Info("state restored", attrs...)
}
