package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"time"
)

// A record-timed replay decays by the records' own times, so the tick
// decides how much of the input the final report remembers: a count reads
// 0 after about 24 silent ticks (README, Sizing and the Tick Table). With
// the default 1 s tick a day-long access log would show only its last
// half-minute. When -tick is not given, the tick is chosen from the span of
// the records' times: the first tick of spanTicks whose one tick holds the
// whole span. Ticks are Unix time divided by the tick, so a day from 06:25
// to 06:25 crosses a 24h tick's midnight and takes a 7-day tick: every
// record then counts whole, whatever the order of the files, as
// `sort | uniq -c` or GoAccess count a day's log.

// spanTicks are the ticks a span is rounded up to.
var spanTicks = []time.Duration{
	time.Second, 10 * time.Second, time.Minute, 10 * time.Minute,
	time.Hour, 6 * time.Hour, 24 * time.Hour, 7 * 24 * time.Hour,
	30 * 24 * time.Hour, 365 * 24 * time.Hour,
}

// spanTick is the tick chosen for records from lo to hi: the first of
// spanTicks, or beyond them a whole number of days, doubled until it fits,
// in one tick of which lo and hi both fall.
func spanTick(lo, hi time.Time) time.Duration {
	oneTick := func(t time.Duration) bool {
		return lo.UnixNano()/int64(t) == hi.UnixNano()/int64(t)
	}
	for _, t := range spanTicks {
		if hi.Sub(lo) <= t && oneTick(t) {
			return t
		}
	}
	const day = 24 * time.Hour
	t := (hi.Sub(lo) + day - 1) / day * day
	for !oneTick(t) {
		t *= 2
	}
	return t
}

// spanScanBytes bounds the work of finding a file's span: its first and
// last spanScanBytes of (decompressed) text are parsed.
const spanScanBytes = 256 << 10

// timeSpan is the earliest and latest record time seen.
type timeSpan struct{ lo, hi time.Time }

func (s *timeSpan) add(t time.Time) {
	if t.IsZero() {
		return
	}
	if s.lo.IsZero() || t.Before(s.lo) {
		s.lo = t
	}
	if t.After(s.hi) {
		s.hi = t
	}
}

func (s timeSpan) span() time.Duration { return s.hi.Sub(s.lo) }

// String is the span as a line of the tool's messages says it.
func (s timeSpan) String() string {
	const layout = "2006-01-02 15:04:05"
	return fmt.Sprintf("%s (%s to %s)", formatDuration(s.span()), s.lo.UTC().Format(layout), s.hi.UTC().Format(layout))
}

// filesSpan finds the span of the records' times in files by parsing the
// first and last lines of each (logs are written in time order). It
// reports false when an input cannot be scanned ahead of the run: standard
// input, a pipe, or a file that cannot be read (the run itself reports that).
func filesSpan(files []string, parse parser) (timeSpan, bool) {
	var s timeSpan
	for _, name := range files {
		if name == "-" {
			return s, false
		}
		if !fileSpan(name, parse, &s) {
			return s, false
		}
	}
	return s, !s.lo.IsZero()
}

// fileSpan adds the times of the first and last lines of one regular file,
// plain or gzip, to s.
func fileSpan(name string, parse parser, s *timeSpan) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	br := bufio.NewReaderSize(f, 1<<16)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return false
		}
		defer zr.Close()
		r = zr
	} else if fi.Size() > 2*spanScanBytes {
		// A plain file: its head, then a seek to its tail.
		head := make([]byte, spanScanBytes)
		n, _ := io.ReadFull(br, head)
		addTimes(head[:n], parse, s, false, true)
		tail := make([]byte, spanScanBytes)
		n, _ = f.ReadAt(tail, fi.Size()-spanScanBytes)
		addTimes(tail[:n], parse, s, true, false)
		return true
	}
	// A small file, or gzip (read through, keeping the head and the tail).
	head := make([]byte, spanScanBytes)
	n, _ := io.ReadFull(r, head)
	addTimes(head[:n], parse, s, false, n == len(head))
	tail := &tailBuffer{max: spanScanBytes}
	io.Copy(tail, r) // a file that breaks off (a truncated gzip) gives the span of what it holds; the run reports the break
	addTimes(tail.b, parse, s, true, false)
	return true
}

// addTimes parses the lines of a chunk and adds their times to s: a chunk
// that may begin mid-line starts after its first newline, and one that may
// end mid-line ends at its last.
func addTimes(chunk []byte, parse parser, s *timeSpan, cutStart, cutEnd bool) {
	if cutStart {
		if i := bytes.IndexByte(chunk, '\n'); i >= 0 {
			chunk = chunk[i+1:]
		}
	}
	for len(chunk) > 0 {
		line, rest, found := bytes.Cut(chunk, []byte("\n"))
		if !found && cutEnd {
			break
		}
		chunk = rest
		if r, err := parse(bytes.TrimSuffix(line, []byte("\r"))); err == nil {
			s.add(r.when)
		}
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > t.max {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}
