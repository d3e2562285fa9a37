package sketchproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/epochsketch/epochsketch"
)

// The state file holds every sketch (limits, budgets, new keys, bans):
// "SKPXSTAT", a version (uint16) and a count (uint32); since version 2 the
// new-key meter's moving average (float64 bits, uint64); then per sketch
// its tick (ns), bucket count and two-choice flag, and its epochsketch
// snapshot; then "SKPXEND!". Version 1 files (no meter) are still read. It holds the sketches' hash keys: it is
// written 0600; keep it private.

const (
	stateMagic   = "SKPXSTAT"
	stateEnd     = "SKPXEND!"
	stateVersion = 2
)

// SaveState writes every sketch to the config's state_file, crash-safely.
// cmd/sketchproxy calls it every state_every and Close calls it last.
func (m *Middleware) SaveState() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.state.Load()
	path := st.cfg.StateFile
	if path == "" {
		return nil
	}
	keys := make([]sketchKey, 0, len(st.sketches))
	for k := range st.sketches {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].tick != keys[j].tick {
			return keys[i].tick < keys[j].tick
		}
		return keys[i].buckets < keys[j].buckets
	})
	start := time.Now()
	err := writeFileAtomic(path, 0o600, func(w io.Writer) error {
		bw := bufio.NewWriterSize(w, 1<<16)
		var h [14]byte
		copy(h[:], stateMagic)
		binary.LittleEndian.PutUint16(h[8:], stateVersion)
		binary.LittleEndian.PutUint32(h[10:], uint32(len(keys)))
		bw.Write(h[:])
		var meter [8]byte
		binary.LittleEndian.PutUint64(meter[:], m.spike.avg.Load())
		bw.Write(meter[:])
		for _, k := range keys {
			var e [17]byte
			binary.LittleEndian.PutUint64(e[0:], uint64(k.tick))
			binary.LittleEndian.PutUint64(e[8:], uint64(k.buckets))
			if k.two {
				e[16] = 1
			}
			bw.Write(e[:])
			if _, err := st.sketches[k].WriteTo(bw); err != nil {
				return err
			}
		}
		bw.WriteString(stateEnd)
		return bw.Flush()
	})
	if err != nil {
		m.met.stateSaves[1].Add(1)
		return fmt.Errorf("saving the state to %s: %w", path, err)
	}
	m.met.stateSaves[0].Add(1)
	m.log.Debug("state saved", "file", path, "sketches", len(keys), "took", time.Since(start).String())
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
	sum, err := readState(bufio.NewReaderSize(f, 1<<16), st)
	if err == nil && sum.meter {
		// The new keys' average survives, so a restart needs no warm-up:
		// the clients of before are known keys, not a spike.
		m.spike.avg.Store(sum.meterAvg)
		m.restoredMeter.Store(true)
		m.lastNew.Store(m.now().UnixNano()) // marks may have been restored
	}
	if err != nil {
		for _, s := range st.sketches {
			s.Reset()
		}
		m.met.stateLoads[1].Add(1)
		m.log.Error("state file rejected: starting empty", "file", path, "err", err.Error())
		return
	}
	m.met.stateLoads[0].Add(1)
	m.lastBan.Store(m.now().UnixNano()) // bans may have been restored
	m.log.Info("state restored", "file", path, "saved", sum.saved.UTC().Format(time.RFC3339),
		"age", m.now().Sub(sum.saved).Round(time.Second).String(), "sketches", sum.restored, "skipped", sum.skipped,
		"live_slots", sum.live, "expired_slots", sum.expired)
}

// stateSummary is what a state file restored.
type stateSummary struct {
	restored, skipped, live, expired int
	saved                            time.Time
	meter                            bool // a version 2 file: meterAvg is set
	meterAvg                         uint64
}

func readState(r *bufio.Reader, st *state) (sum stateSummary, err error) {
	var h [14]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return stateSummary{}, fmt.Errorf("truncated header")
	}
	if string(h[:8]) != stateMagic {
		return stateSummary{}, fmt.Errorf("not a SketchProxy state file")
	}
	v := binary.LittleEndian.Uint16(h[8:])
	if v < 1 || v > stateVersion {
		return stateSummary{}, fmt.Errorf("state version %d, this build reads 1 to %d", v, stateVersion)
	}
	if v >= 2 {
		var meter [8]byte
		if _, err = io.ReadFull(r, meter[:]); err != nil {
			return stateSummary{}, fmt.Errorf("truncated header")
		}
		sum.meter, sum.meterAvg = true, binary.LittleEndian.Uint64(meter[:])
	}
	n := binary.LittleEndian.Uint32(h[10:])
	if n > 1024 {
		return stateSummary{}, fmt.Errorf("%d sketches: damaged", n)
	}
	for range n {
		var e [17]byte
		if _, err = io.ReadFull(r, e[:]); err != nil {
			return stateSummary{}, fmt.Errorf("truncated")
		}
		k := sketchKey{tick: time.Duration(binary.LittleEndian.Uint64(e[0:])), buckets: int(binary.LittleEndian.Uint64(e[8:])), two: e[16] == 1}
		if k.buckets < 1 || k.buckets > 1<<26 {
			return stateSummary{}, fmt.Errorf("a sketch of %d buckets: damaged", k.buckets)
		}
		sk, ok := st.sketches[k]
		if !ok {
			if _, err = io.CopyN(io.Discard, r, epochsketch.SnapshotSize(k.buckets)); err != nil {
				return stateSummary{}, fmt.Errorf("truncated")
			}
			sum.skipped++
			continue
		}
		info, lerr := sk.LoadFrom(r)
		if lerr != nil {
			return stateSummary{}, fmt.Errorf("sketch (tick %v, %d buckets): %w", k.tick, k.buckets, lerr)
		}
		sum.restored++
		sum.live += info.Live
		sum.expired += info.Expired
		sum.saved = info.Saved
	}
	var end [8]byte
	if _, err = io.ReadFull(r, end[:]); err != nil || string(end[:]) != stateEnd {
		return stateSummary{}, fmt.Errorf("truncated: the end marker is missing")
	}
	return sum, nil
}
