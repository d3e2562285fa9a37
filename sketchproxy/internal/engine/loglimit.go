package engine

import (
	"sync/atomic"
	"time"
)

// LogLimiter lets a door log at most a number of lines (refusals, failed
// settlements) each second of the clock, and counts the lines it held
// back, so that the next line can say how many were left out. The zero
// LogLimiter is ready; it is safe for concurrent use.
type LogLimiter struct {
	sec, n, skipped atomic.Int64
}

// Allow reports whether a line at now may be logged, at most max a
// second; when it may, skipped is how many were held back since the last
// line logged.
func (l *LogLimiter) Allow(now time.Time, max int64) (ok bool, skipped int64) {
	s := now.Unix()
	if old := l.sec.Load(); old != s && l.sec.CompareAndSwap(old, s) {
		l.n.Store(0)
	}
	if l.n.Add(1) > max {
		l.skipped.Add(1)
		return false, 0
	}
	return true, l.skipped.Swap(0)
}
