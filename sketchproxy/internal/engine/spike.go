package engine

import (
	"math"
	"sync/atomic"
	"time"
)

// spikeMeter counts new keys per second and keeps a moving average of past
// seconds (about 30 s), with no goroutine: the first call in a new second
// rolls the window.
type spikeMeter struct {
	sec   atomic.Int64
	cur   atomic.Int64
	last  atomic.Int64  // the last whole second's count
	avg   atomic.Uint64 // float64 bits: the moving average before that
	total atomic.Uint64
}

const spikeAlpha = 1.0 / 30

// first records a new key.
func (s *spikeMeter) first(now time.Time) {
	s.roll(now)
	s.cur.Add(1)
	s.total.Add(1)
}

func (s *spikeMeter) roll(now time.Time) {
	sec := now.Unix()
	old := s.sec.Load()
	if old == sec || !s.sec.CompareAndSwap(old, sec) {
		return
	}
	n := s.cur.Swap(0)
	gap := sec - old
	if old == 0 || gap < 0 {
		gap = 1
	}
	if gap > 1 {
		n = 0 // the whole seconds between had none
	}
	a := math.Float64frombits(s.avg.Load())
	prev := s.last.Swap(n)
	a = a + spikeAlpha*(float64(prev)-a)
	a *= math.Pow(1-spikeAlpha, float64(min(gap-1, 1000)))
	s.avg.Store(math.Float64bits(a))
}

// rate is the new keys per second now: the larger of the last whole second
// and the current one so far.
func (s *spikeMeter) rate(now time.Time) float64 {
	s.roll(now)
	return float64(max(s.last.Load(), s.cur.Load()))
}

// active reports a spike: the rate above MinPerSecond and above SpikeFactor
// times the average of the seconds before.
func (s *spikeMeter) active(now time.Time, c *NewKeysSpec) bool {
	r := s.rate(now)
	return r > c.MinPerSecond && r > c.SpikeFactor*math.Float64frombits(s.avg.Load())
}
