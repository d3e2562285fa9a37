package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/epochsketch/epochsketch"
)

// A top state file: "EPTOPSTA", a version (uint16), the length of a JSON
// header (uint32) and the header, then the sketch's snapshot and the TopK's.
// It holds the hash key and the heaviest keys: keep it private (0600).

const (
	stateMagic   = "EPTOPSTA"
	stateVersion = 1
)

// topMeta is what a resumed replay needs beside the sketch.
type topMeta struct {
	Lines, Empty, Malformed, Firsts int
	Now                             time.Time // the latest record's time
	Clock                           time.Time // the replay clock (-lines-per-tick)
	Format, Key                     string
	Buckets                         int
	Tick                            time.Duration
}

func saveState(path string, st *topState, clk *epochsketch.ManualClock) error {
	m := topMeta{Lines: st.lines, Empty: st.empty, Malformed: st.malformed, Firsts: st.firsts, Now: st.now,
		Format: st.o.format, Key: st.o.key, Buckets: st.o.buckets, Tick: st.o.tick}
	if clk != nil {
		m.Clock = clk.Now()
	}
	head, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return epochsketch.WriteFileAtomic(path, 0o600, func(w io.Writer) error {
		var b [14]byte
		copy(b[:], stateMagic)
		binary.LittleEndian.PutUint16(b[8:], stateVersion)
		binary.LittleEndian.PutUint32(b[10:], uint32(len(head)))
		if _, err := w.Write(b[:]); err != nil {
			return err
		}
		if _, err := w.Write(head); err != nil {
			return err
		}
		if _, err := st.sk.WriteTo(w); err != nil {
			return err
		}
		_, err := st.top.WriteTo(w)
		return err
	})
}

// loadState restores a state file into st; a missing file is not an error
// (the first run creates it).
func loadState(path string, st *topState, clk *epochsketch.ManualClock) (bool, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	bad := func(format string, a ...any) (bool, error) {
		return false, fmt.Errorf("-state %s: "+format+" (delete the file to start empty)", append([]any{path}, a...)...)
	}
	if len(data) < 14 || string(data[:8]) != stateMagic {
		return bad("not an epochsketch top state file")
	}
	if v := binary.LittleEndian.Uint16(data[8:]); v != stateVersion {
		return bad("state version %d, this build reads %d", v, stateVersion)
	}
	n := int(binary.LittleEndian.Uint32(data[10:]))
	if n > len(data)-14 {
		return bad("truncated")
	}
	var m topMeta
	if err := json.Unmarshal(data[14:14+n], &m); err != nil {
		return bad("damaged header: %v", err)
	}
	if m.Format != st.o.format || m.Key != st.o.key || m.Buckets != st.o.buckets || m.Tick != st.o.tick {
		return bad("saved with -format %s -key %s -buckets %d -tick %v; this run has -format %s -key %s -buckets %d -tick %v",
			m.Format, m.Key, m.Buckets, m.Tick, st.o.format, st.o.key, st.o.buckets, st.o.tick)
	}
	if clk != nil && !m.Clock.IsZero() {
		clk.Set(m.Clock) // the replay clock goes on from where it stopped
	}
	r := bytes.NewReader(data[14+n:])
	if _, err := st.sk.ReadFrom(r); err != nil {
		return bad("%v", err)
	}
	if _, err := st.top.ReadFrom(r); err != nil {
		return bad("%v", err)
	}
	if r.Len() != 0 {
		return bad("%d bytes after the end", r.Len())
	}
	st.lines, st.empty, st.malformed, st.firsts, st.now = m.Lines, m.Empty, m.Malformed, m.Firsts, m.Now
	return true, nil
}
