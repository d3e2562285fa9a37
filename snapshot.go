package epochsketch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"time"

	"github.com/epochsketch/epochsketch/atomicfile"
)

// A snapshot is a versioned, checksummed image of a Sketch, written by
// WriteTo (or SaveFile) and read back by ReadFrom (or LoadFile):
//
//	header  96 bytes: magic "EPOCHSKT", version, flags, hash kind, lottery,
//	        NumBuckets, TickDuration, the tick and the wall time when taken,
//	        the hash key, the lottery's salt state, CRC-32C of the header
//	body    NumBuckets × 64 bytes: every slot word, little-endian
//	trailer CRC-32C of the body, then "ENDS"
//
// A snapshot holds the hash key, so it is a secret: whoever reads it can
// aim keys at one bucket (THEORY.md section 6). A sketch hashed with
// maphash cannot be saved: its seed cannot be exported; use HashWyhash or
// HashSipHash13.

const (
	snapMagic      = "EPOCHSKT"
	snapEnd        = "ENDS"
	snapVersion    = 1
	snapHeaderSize = 96
	snapChunk      = 1 << 16 // bytes per streamed chunk
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SnapshotSize is the size in bytes of a snapshot of a sketch with n
// buckets.
func SnapshotSize(numBuckets int) int64 {
	return snapHeaderSize + int64(numBuckets)*int64(bucketSize) + 8
}

// SnapshotInfo describes a restored snapshot.
type SnapshotInfo struct {
	Saved   time.Time // wall-clock time of the snapshot
	Tick    int64     // the sketch's tick when it was taken
	Live    int       // slots restored
	Expired int       // slots dropped: they read 0 after the downtime
}

// SnapshotError is a snapshot that cannot be restored: damaged, foreign,
// from a newer version, or taken with a different Config. Field names the
// Config field that differs, when one does.
type SnapshotError struct {
	Field string
	Msg   string
	// Err is the cause, if any: io.ErrUnexpectedEOF for a truncated
	// snapshot, or the reader's own error.
	Err error
}

func (e *SnapshotError) Error() string {
	msg := e.Msg
	if e.Err != nil && !errors.Is(e.Err, io.ErrUnexpectedEOF) {
		msg += ": " + e.Err.Error()
	}
	if e.Field != "" {
		return "epochsketch: snapshot: Config." + e.Field + ": " + msg
	}
	return "epochsketch: snapshot: " + msg
}

// Unwrap returns the cause.
func (e *SnapshotError) Unwrap() error { return e.Err }

func snapErr(format string, a ...any) error { return &SnapshotError{Msg: fmt.Sprintf(format, a...)} }

// readErr is a read that failed: a snapshot cut short is truncated
// (io.ErrUnexpectedEOF underneath); any other error is the reader's, passed
// through underneath a SnapshotError.
func readErr(err error, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return &SnapshotError{Msg: "truncated: " + msg, Err: io.ErrUnexpectedEOF}
	}
	return &SnapshotError{Msg: "reading " + msg, Err: err}
}

// ErrMaphashSnapshot is returned when saving a sketch hashed with maphash.
var ErrMaphashSnapshot = errors.New("epochsketch: snapshot: a maphash sketch cannot be saved: hash/maphash seeds cannot be exported; use Config.Hash = HashWyhash or HashSipHash13 (random keys are saved in the snapshot)")

type snapHeader struct {
	version   uint16
	twoChoice bool
	hash      HashKind
	lottery   lottery
	buckets   uint64
	tick      int64 // TickDuration in ns
	at        int64 // the tick when taken
	wall      int64 // UnixNano when taken
	k0, k1    uint64
	seeded    bool
	smooth    bool // a smooth sketch's (smooth.go): its counts are scaled
	saltBase  uint64
	saltN     uint64
}

func (h *snapHeader) encode() []byte {
	b := make([]byte, snapHeaderSize)
	copy(b, snapMagic)
	le := binary.LittleEndian
	le.PutUint16(b[8:], h.version)
	var flags uint16
	if h.twoChoice {
		flags |= 1
	}
	if h.seeded {
		flags |= 2
	}
	if h.smooth {
		flags |= 4
	}
	le.PutUint16(b[10:], flags)
	b[12], b[13] = hashCodes[h.hash], byte(h.lottery)
	le.PutUint64(b[16:], h.buckets)
	le.PutUint64(b[24:], uint64(h.tick))
	le.PutUint64(b[32:], uint64(h.at))
	le.PutUint64(b[40:], uint64(h.wall))
	le.PutUint64(b[48:], h.k0)
	le.PutUint64(b[56:], h.k1)
	le.PutUint64(b[64:], h.saltBase)
	le.PutUint64(b[72:], h.saltN)
	le.PutUint32(b[88:], crc32.Checksum(b[:88], castagnoli))
	return b
}

func decodeHeader(b []byte) (snapHeader, error) {
	var h snapHeader
	if string(b[:8]) != snapMagic {
		return h, snapErr("not an EpochSketch snapshot (the file starts %q, want %q)", printable(b[:8]), snapMagic)
	}
	le := binary.LittleEndian
	h.version = le.Uint16(b[8:])
	if h.version > snapVersion {
		return h, snapErr("format version %d was written by a newer epochsketch; this build reads version %d", h.version, snapVersion)
	}
	if h.version == 0 {
		return h, snapErr("format version 0 is invalid")
	}
	if got, want := crc32.Checksum(b[:88], castagnoli), le.Uint32(b[88:]); got != want {
		return h, snapErr("header checksum mismatch (%08x, want %08x): the file is damaged", got, want)
	}
	flags := le.Uint16(b[10:])
	h.twoChoice, h.seeded, h.smooth = flags&1 != 0, flags&2 != 0, flags&4 != 0
	var ok bool
	if h.hash, ok = hashOfCode(b[12]); !ok {
		return h, snapErr("hash code %d names no hash this build knows: the file is damaged or from a newer epochsketch", b[12])
	}
	h.lottery = lottery(b[13])
	h.buckets = le.Uint64(b[16:])
	h.tick = int64(le.Uint64(b[24:]))
	h.at = int64(le.Uint64(b[32:]))
	h.wall = int64(le.Uint64(b[40:]))
	h.k0, h.k1 = le.Uint64(b[48:]), le.Uint64(b[56:])
	h.saltBase, h.saltN = le.Uint64(b[64:]), le.Uint64(b[72:])
	return h, nil
}

func printable(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if c < 0x20 || c > 0x7e {
			c = '.'
		}
		out[i] = c
	}
	return string(out)
}

// WriteTo writes a snapshot of s to w, streaming: it needs 64 KiB of
// buffer whatever the table's size. Observe and Estimate may run
// concurrently: every word is read atomically, so the snapshot is a valid
// state, each slot as it was at some instant during the write (not one
// instant for the whole table). It implements io.WriterTo.
func (s *Sketch) WriteTo(w io.Writer) (int64, error) {
	if s.h.kind == HashMaphash {
		return 0, ErrMaphashSnapshot
	}
	h := snapHeader{
		version: snapVersion, twoChoice: s.twoChoice, hash: s.h.kind, lottery: s.lottery,
		buckets: s.nb, tick: s.tick, at: s.clk.hw.Load(), wall: s.wallNow().UnixNano(),
		k0: s.h.k0, k1: s.h.k1, smooth: s.sm != nil,
	}
	if s.seeded != nil {
		h.seeded, h.saltBase, h.saltN = true, s.seeded.base, s.seeded.n.Load()
	}
	n, err := w.Write(h.encode())
	total := int64(n)
	if err != nil {
		return total, err
	}
	crc := uint32(0)
	buf := make([]byte, 0, snapChunk)
	for i := range s.table {
		for j := range s.table[i].s {
			buf = binary.LittleEndian.AppendUint64(buf, s.table[i].s[j].Load())
		}
		if len(buf) == cap(buf) || i == len(s.table)-1 {
			crc = crc32.Update(crc, castagnoli, buf)
			n, err := w.Write(buf)
			total += int64(n)
			if err != nil {
				return total, err
			}
			buf = buf[:0]
		}
	}
	var tr [8]byte
	binary.LittleEndian.PutUint32(tr[:], crc)
	copy(tr[4:], snapEnd)
	n, err = w.Write(tr[:])
	return total + int64(n), err
}

// wallNow is the clock's time (a ManualClock's in tests).
func (s *Sketch) wallNow() time.Time {
	switch {
	case s.manual != nil:
		return s.manual.Now()
	case s.custom != nil:
		return s.custom.Now()
	}
	return time.Now()
}

// ReadFrom restores a snapshot into s, which must be new (from New) and not
// yet shared: ReadFrom must not run concurrently with any other method.
// The snapshot must match s's Config in NumBuckets, TickDuration, Hash and
// TwoChoice; a Config with a non-zero Seed must have the
// snapshot's seed, and a Config with Seed 0 adopts the snapshot's hash key.
//
// Counts decay over the downtime exactly as if the process had run:
// epochs are wall-clock ticks, so a slot reads count >> (now − its tick).
// Slots that read 0 by now are dropped, so that no downtime, even longer
// than the epoch's 2^24-tick wrap, brings a count back.
//
// A damaged, truncated, foreign or newer-version snapshot, or one that does
// not match, returns a *SnapshotError (or the reader's error) and leaves s
// empty and usable. It implements io.ReaderFrom.
func (s *Sketch) ReadFrom(r io.Reader) (int64, error) {
	_, n, err := s.restore(r)
	return n, err
}

func (s *Sketch) restore(r io.Reader) (SnapshotInfo, int64, error) {
	var info SnapshotInfo
	hb := make([]byte, snapHeaderSize)
	n, err := io.ReadFull(r, hb)
	total := int64(n)
	if err != nil {
		return info, total, readErr(err, "the header (%d of %d bytes)", n, snapHeaderSize)
	}
	h, err := decodeHeader(hb)
	if err != nil {
		return info, total, err
	}
	if err := s.matches(&h); err != nil {
		return info, total, err
	}
	now := s.peekNow()
	if now < h.at {
		now = s.clk.advance(h.at) // a clock behind the snapshot: time never runs backwards
	}
	gap := now - h.at
	crc := uint32(0)
	buf := make([]byte, snapChunk)
	want := int64(s.nb) * int64(bucketSize)
	var read int64
	slot := 0
	fail := func(err error) (SnapshotInfo, int64, error) {
		s.clear()
		return SnapshotInfo{}, total, err
	}
	for read < want {
		chunk := buf[:min(int64(len(buf)), want-read)]
		n, err := io.ReadFull(r, chunk)
		total += int64(n)
		read += int64(n)
		if err != nil {
			return fail(readErr(err, "the body (%d of %d bytes)", total, SnapshotSize(int(s.nb))))
		}
		crc = crc32.Update(crc, castagnoli, chunk)
		for off := 0; off < len(chunk); off += 8 {
			w := binary.LittleEndian.Uint64(chunk[off:])
			if w != 0 {
				// The slot's age when taken, plus the downtime.
				age := int64(ageOf(w, epoch24(h.at))) + gap
				if age >= evaporation {
					w = 0
					info.Expired++
				} else {
					info.Live++
				}
			}
			s.table[slot>>3].s[slot&7].Store(w)
			slot++
		}
	}
	var tr [8]byte
	n, err = io.ReadFull(r, tr[:])
	total += int64(n)
	if err != nil {
		return fail(readErr(err, "the trailer (%d of %d bytes)", total, SnapshotSize(int(s.nb))))
	}
	if got := binary.LittleEndian.Uint32(tr[:]); got != crc || string(tr[4:]) != snapEnd {
		return fail(snapErr("body checksum mismatch (%08x, want %08x): the file is damaged", crc, got))
	}
	if s.seeded == nil {
		s.h.setKey(h.k0, h.k1) // adopt the snapshot's random key
	} else if h.seeded {
		s.seeded.n.Store(h.saltN)
	}
	info.Saved, info.Tick = time.Unix(0, h.wall), h.at
	return info, total, nil
}

// matches checks a header against s's Config.
func (s *Sketch) matches(h *snapHeader) error {
	field := func(name string, snap, cfg any) error {
		return &SnapshotError{Field: name, Msg: fmt.Sprintf("the snapshot has %v, the Config %v", snap, cfg)}
	}
	switch {
	case h.buckets != s.nb:
		return field("NumBuckets", h.buckets, s.nb)
	case h.tick != s.tick:
		return field("TickDuration", time.Duration(h.tick), time.Duration(s.tick))
	case h.hash != s.h.kind:
		return field("Hash", h.hash, s.h.kind)
	case h.twoChoice != s.twoChoice:
		return field("TwoChoice", h.twoChoice, s.twoChoice)
	case h.smooth != (s.sm != nil):
		return &SnapshotError{Msg: fmt.Sprintf("the snapshot's counts decay %s, this sketch's %s: a rate limiter's (package limit, SketchProxy) decay smoothly, and state saved before they did cannot be read into them", decayName(h.smooth), decayName(s.sm != nil))}
	case h.lottery != s.lottery:
		return &SnapshotError{Msg: fmt.Sprintf("the snapshot was taken with %v, this sketch runs %v (the chip lottery is the simulator's and the experiments' only)", h.lottery, s.lottery)}
	case s.seeded != nil && (h.k0 != s.h.k0 || h.k1 != s.h.k1):
		return &SnapshotError{Field: "Seed", Msg: "differs from the seed the snapshot was taken with: keys would hash elsewhere (use that seed, or Seed 0 to adopt the snapshot's)"}
	}
	return nil
}

// Reset empties s: every slot reads 0. Concurrent calls may land before or
// after it, slot by slot.
func (s *Sketch) Reset() { s.clear() }

func (s *Sketch) clear() {
	for i := range s.table {
		for j := range s.table[i].s {
			s.table[i].s[j].Store(0)
		}
	}
}

// SaveFile writes a snapshot to path crash-safely (a temporary file, synced,
// renamed over path, the directory synced),
// readable by its owner only: it holds the hash key.
func (s *Sketch) SaveFile(path string) error {
	return atomicfile.Write(path, 0o600, func(w io.Writer) error {
		_, err := s.WriteTo(w)
		return err
	})
}

// LoadFrom is ReadFrom that says what the snapshot held instead of how many
// bytes it read, as LoadFile does for a file: for a snapshot inside a stream
// of the caller's (a file of several sketches, a network copy). It reads the
// snapshot exactly and nothing after it, so a caller can read on from r. On
// any error s is left empty and usable.
func (s *Sketch) LoadFrom(r io.Reader) (SnapshotInfo, error) {
	info, _, err := s.restore(r)
	return info, err
}

// LoadFile restores a snapshot written by SaveFile (see ReadFrom). On any
// error s is left empty and usable.
func (s *Sketch) LoadFile(path string) (SnapshotInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer f.Close()
	info, err := s.LoadFrom(f)
	if err == nil {
		var one [1]byte
		if n, _ := f.Read(one[:]); n != 0 {
			s.clear()
			return SnapshotInfo{}, snapErr("%s: bytes after the end of the snapshot", path)
		}
	}
	return info, err
}

// decayName names how a sketch's counts decay, for SnapshotError.
func decayName(smooth bool) string {
	if smooth {
		return "smoothly (a rate limiter's)"
	}
	return "by halving at each tick"
}
