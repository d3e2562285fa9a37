package epochsketch

import (
	"bufio"
	"encoding/binary"
	"hash/crc32"
	"io"
)

// A TopK snapshot: "EPOCHTOP", version (uint16), k and the entry count
// (uvarints), then per entry the estimate (uvarint), since version 2 the
// tick it was taken at (varint), the key length (uvarint) and the key, then
// CRC-32C of all before it. Keys may be client addresses or API keys: treat
// the file as you treat your logs. A version 1 snapshot (no ticks) is
// migrated: its entries are taken as current when it is read.

const (
	topMagic   = "EPOCHTOP"
	topVersion = 2
	maxTopKey  = 1 << 20 // a key longer than 1 MiB is damage, not a key
)

// WriteTo writes a snapshot of tk's entries to w. It implements io.WriterTo.
func (tk *TopK) WriteTo(w io.Writer) (int64, error) {
	tk.mu.Lock()
	entries := append([]topEntry(nil), tk.heap...)
	k := tk.k
	tk.mu.Unlock()
	cw := &crcWriter{w: w}
	bw := bufio.NewWriter(cw)
	bw.WriteString(topMagic)
	var b [binary.MaxVarintLen64]byte
	binary.LittleEndian.PutUint16(b[:2], topVersion)
	bw.Write(b[:2])
	uv := func(x uint64) { bw.Write(b[:binary.PutUvarint(b[:], x)]) }
	uv(uint64(k))
	uv(uint64(len(entries)))
	for _, e := range entries {
		uv(uint64(e.count))
		bw.Write(b[:binary.PutVarint(b[:], e.tick)])
		uv(uint64(len(e.key)))
		bw.WriteString(e.key)
	}
	if err := bw.Flush(); err != nil {
		return cw.n, err
	}
	var tr [4]byte
	binary.LittleEndian.PutUint32(tr[:], cw.crc)
	n, err := w.Write(tr[:])
	return cw.n + int64(n), err
}

type crcWriter struct {
	w   io.Writer
	crc uint32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc = crc32.Update(c.crc, castagnoli, p[:n])
	c.n += int64(n)
	return n, err
}

type crcReader struct {
	r   *bufio.Reader
	crc uint32
	n   int64
}

func (c *crcReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.crc = crc32.Update(c.crc, castagnoli, p[:n])
	c.n += int64(n)
	return n, err
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.crc = crc32.Update(c.crc, castagnoli, []byte{b})
		c.n++
	}
	return b, err
}

// ReadFrom replaces tk's entries with a snapshot's. The snapshot's k must be
// at most tk's. On error tk is unchanged. It implements io.ReaderFrom; it
// reads exactly the snapshot, no further.
func (tk *TopK) ReadFrom(r io.Reader) (int64, error) {
	cr := &crcReader{r: bufio.NewReaderSize(oneByteAtATime{r}, 16)}
	fail := func(format string, a ...any) (int64, error) { return cr.n, snapErr("TopK: "+format, a...) }
	// failRead reports a read that failed: truncation, or the reader's own
	// error passed through.
	failRead := func(err error, what string) (int64, error) { return cr.n, readErr(err, "TopK: %s", what) }
	var head [10]byte
	if _, err := io.ReadFull(cr, head[:]); err != nil {
		return failRead(err, "the header")
	}
	if string(head[:8]) != topMagic {
		return fail("not a TopK snapshot (starts %q)", printable(head[:8]))
	}
	version := binary.LittleEndian.Uint16(head[8:])
	if version < 1 || version > topVersion {
		return fail("format version %d, this build reads 1 to %d", version, topVersion)
	}
	now := tk.now() // a version 1 entry's tick
	k, err := binary.ReadUvarint(cr)
	if err != nil {
		return failRead(err, "k")
	}
	n, err := binary.ReadUvarint(cr)
	if err != nil {
		return failRead(err, "the entry count")
	}
	if n > k || k > uint64(tk.k) {
		return fail("%d entries of k = %d do not fit a TopK of k = %d", n, k, tk.k)
	}
	entries := make([]topEntry, 0, n)
	for range n {
		est, err := binary.ReadUvarint(cr)
		if err != nil {
			return failRead(err, "an entry")
		}
		if est > MaxCount {
			return fail("a damaged entry (estimate %d)", est)
		}
		tick := now
		if version >= 2 {
			if tick, err = binary.ReadVarint(cr); err != nil {
				return failRead(err, "an entry's tick")
			}
		}
		l, err := binary.ReadUvarint(cr)
		if err != nil {
			return failRead(err, "an entry's key length")
		}
		if l > maxTopKey {
			return fail("a damaged entry (a key of %d bytes)", l)
		}
		key := make([]byte, l)
		if _, err := io.ReadFull(cr, key); err != nil {
			return failRead(err, "an entry's key")
		}
		entries = append(entries, topEntry{string(key), uint32(est), tick})
	}
	want := cr.crc
	var tr [4]byte
	if _, err := io.ReadFull(cr.r, tr[:]); err != nil {
		return failRead(err, "the checksum")
	}
	if binary.LittleEndian.Uint32(tr[:]) != want {
		return fail("checksum mismatch: the snapshot is damaged")
	}
	tk.mu.Lock()
	defer tk.mu.Unlock()
	tk.heap = tk.heap[:0]
	clear(tk.index)
	tk.floorCount.Store(0)
	for _, e := range entries {
		if _, dup := tk.index[e.key]; dup {
			continue
		}
		tk.insert(e.key, e.count, e.tick)
	}
	return cr.n + 4, nil
}

// oneByteAtATime keeps a bufio.Reader from reading past the snapshot's end
// when tk.ReadFrom shares a stream with what follows.
type oneByteAtATime struct{ r io.Reader }

func (o oneByteAtATime) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}
