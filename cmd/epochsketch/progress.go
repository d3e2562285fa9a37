package main

import (
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// progress shows bytes read, rate and ETA on one line of standard error when
// reading files of known size.
type progress struct {
	total int64
	read  atomic.Int64
	start time.Time
	last  time.Time
	w     io.Writer
}

func newProgress(files []string, w io.Writer) *progress {
	p := &progress{start: time.Now(), w: w}
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
			p.total += fi.Size()
		}
	}
	return p
}

type countingReader struct {
	r io.Reader
	p *progress
}

func (c countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.p.read.Add(int64(n))
	return n, err
}

func (p *progress) wrap(r io.Reader) io.Reader { return countingReader{r, p} }

// show repaints the line at most every 200 ms.
func (p *progress) show() {
	now := time.Now()
	if now.Sub(p.last) < 200*time.Millisecond {
		return
	}
	p.last = now
	p.print(now)
}

func (p *progress) print(now time.Time) {
	read := p.read.Load()
	secs := max(now.Sub(p.start).Seconds(), 1e-3)
	rate := float64(read) / secs
	if p.total > 0 {
		pct := 100 * float64(read) / float64(p.total)
		eta := time.Duration(float64(p.total-read) / max(rate, 1) * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(p.w, "\r%5.1f%%  %s of %s  %s/s  ETA %v   ", pct, formatBytes(int(read)), formatBytes(int(p.total)), formatBytes(int(rate)), eta)
		return
	}
	fmt.Fprintf(p.w, "\r%s  %s/s   ", formatBytes(int(read)), formatBytes(int(rate)))
}

func (p *progress) done() {
	p.print(time.Now())
	fmt.Fprintln(p.w)
}
