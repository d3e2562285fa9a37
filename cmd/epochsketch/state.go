package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"time"

	"github.com/epochsketch/epochsketch/atomicfile"

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
	// Files are where each input file was left: a resumed run reads on
	// from there, and refuses a file that is no longer the same.
	Files []fileMark `json:",omitempty"`
}

// fileMark is an input file as a state remembers it: its size and the
// hash of its first bytes when last read, and how far its lines were read
// (in bytes of the decompressed stream, for gzip).
type fileMark struct {
	Name    string
	Size    int64
	HeadLen int64  // how many of its first bytes Head hashes (at most 4 KiB)
	Head    string // hex SHA-256 of them
	Offset  int64
}

// fileID is a file's size and the hash of its first bytes.
type fileID struct {
	Size    int64
	HeadLen int64
	Head    string
	head    []byte // the first bytes themselves
}

// headOf is the hex SHA-256 of the first n bytes.
func (id fileID) headOf(n int64) string {
	sum := sha256.Sum256(id.head[:n])
	return hex.EncodeToString(sum[:])
}

const headBytes = 4096

// identify reads f's size and first bytes, and leaves f at its start.
func identify(f *os.File) (fileID, error) {
	fi, err := f.Stat()
	if err != nil {
		return fileID{}, err
	}
	if !fi.Mode().IsRegular() {
		return fileID{Size: -1}, nil // a pipe or a device: no identity to keep
	}
	head := make([]byte, min(fi.Size(), headBytes))
	if _, err := io.ReadFull(f, head); err != nil {
		return fileID{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fileID{}, err
	}
	id := fileID{Size: fi.Size(), HeadLen: int64(len(head)), head: head}
	id.Head = id.headOf(id.HeadLen)
	return id, nil
}

// sameHead reports whether the file still begins as it did when m was
// saved: the hash of the same number of first bytes.
func (id fileID) sameHead(m *fileMark) bool {
	if id.HeadLen == m.HeadLen {
		return id.Head == m.Head
	}
	// The file was shorter than 4 KiB then: hash as many bytes as then.
	return id.HeadLen >= m.HeadLen && id.headOf(m.HeadLen) == m.Head
}

func saveState(path string, st *topState, clk *epochsketch.ManualClock) error {
	m := topMeta{Lines: st.lines, Empty: st.empty, Malformed: st.malformed, Firsts: st.firsts, Now: st.now,
		Format: st.o.format, Key: st.o.key, Buckets: st.o.buckets, Tick: st.o.tick}
	for _, name := range st.order {
		m.Files = append(m.Files, *st.marks[name])
	}
	if clk != nil {
		m.Clock = clk.Now()
	}
	head, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, 0o600, func(w io.Writer) error {
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

// readState reads a state file's header, and returns it with the
// snapshots that follow it; a missing file is found false, not an error.
func readState(path string) (m topMeta, body []byte, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil, false, nil
	}
	if err != nil {
		return m, nil, false, err
	}
	bad := func(format string, a ...any) (topMeta, []byte, bool, error) {
		return m, nil, false, stateErr(path, format, a...)
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
	if err := json.Unmarshal(data[14:14+n], &m); err != nil {
		return bad("damaged header: %v", err)
	}
	return m, data[14+n:], true, nil
}

// stateErr is a state file that cannot be resumed.
func stateErr(path, format string, a ...any) error {
	return fmt.Errorf("-state %s: "+format+" (delete the file to start empty)", append([]any{path}, a...)...)
}

// savedMeta is the header of the state file at path, if there is a
// readable one (a bad one is reported when the run loads it).
func savedMeta(path string) (topMeta, bool) {
	if path == "" {
		return topMeta{}, false
	}
	m, _, found, err := readState(path)
	return m, found && err == nil
}

// loadState restores a state file into st; a missing file is not an error
// (the first run creates it). A state saved at another -k resumes: its
// tracked keys are kept up to this run's 4k, the heaviest first.
func loadState(path string, st *topState, clk *epochsketch.ManualClock) (bool, error) {
	m, body, found, err := readState(path)
	if !found || err != nil {
		return false, err
	}
	bad := func(format string, a ...any) (bool, error) { return false, stateErr(path, format, a...) }
	if m.Format != st.o.format || m.Key != st.o.key || m.Buckets != st.o.buckets || m.Tick != st.o.tick {
		return bad("saved with -format %s -key %s -buckets %d -tick %v; this run has -format %s -key %s -buckets %d -tick %v",
			m.Format, m.Key, m.Buckets, m.Tick, st.o.format, st.o.key, st.o.buckets, st.o.tick)
	}
	if clk != nil && !m.Clock.IsZero() {
		clk.Set(m.Clock) // the replay clock goes on from where it stopped
	}
	r := bytes.NewReader(body)
	if _, err := st.sk.ReadFrom(r); err != nil {
		return bad("%v", err)
	}
	top := st.top
	if k := savedTopK(body[len(body)-r.Len():]); k > st.o.k*4 {
		top = epochsketch.NewTopK(k) // a larger -k before: read it whole, keep the heaviest
	}
	if _, err := top.ReadFrom(r); err != nil {
		return bad("%v", err)
	}
	if top != st.top {
		// Largest first, each estimate rounded down to a multiple of the
		// TopK's sampling step (topk.go, skip), so that no offer is sampled
		// away and ties keep the first, heavier keys. The entries lag by
		// under 1/16, as any TopK entry may; reports read the sketch.
		for _, e := range top.List() {
			est := e.Estimate
			if n := bits.Len32(est); n > 5 {
				est &^= 1<<(n-5) - 1
			}
			st.top.Offer(e.Key, est)
		}
	}
	if r.Len() != 0 {
		return bad("%d bytes after the end", r.Len())
	}
	st.lines, st.empty, st.malformed, st.firsts, st.now = m.Lines, m.Empty, m.Malformed, m.Firsts, m.Now
	st.span.add(m.Now)
	for i := range m.Files {
		f := m.Files[i]
		st.marks[f.Name] = &f
		st.order = append(st.order, f.Name)
	}
	return true, nil
}

// savedTopK is the k of the TopK snapshot that begins b (its header:
// magic, version, then k as a uvarint), or 0 when b is too short to say;
// TopK.ReadFrom then reports the damage.
func savedTopK(b []byte) int {
	if len(b) < 11 {
		return 0
	}
	k, n := binary.Uvarint(b[10:])
	if n <= 0 || k > 4*maxK {
		return 0
	}
	return int(k)
}
