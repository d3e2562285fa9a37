package sketchproxy

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultRefusalLogInterval is how often a rule's refusals are logged
// under a flood when Options.RefusalLogInterval is 0: the first refusal of
// an interval in full, the rest as one summary line at its end.
const DefaultRefusalLogInterval = 10 * time.Second

// refusalLog aggregates the decision log by rule: a flood of refusals is a
// log line per request otherwise. For each rule (and shadow or not), the
// first refusal of an interval is logged whole and opens the interval; the
// refusals that follow are only counted, and when the interval ends one
// line gives their count. The lines' counts add up to every refusal:
// /metrics has the same totals, per outcome. The zero value is ready; it
// is safe for concurrent use, and costs a refusal two atomic operations
// beside a map lookup.
type refusalLog struct {
	rules  sync.Map // ruleLogKey -> *ruleLog; bounded by the rule names configured
	mu     sync.Mutex
	timers map[*ruleLog]*time.Timer // open intervals, to flush at Close
	closed bool
	firing sync.WaitGroup // timers scheduled and not yet summarized
}

type ruleLogKey struct {
	rule   string
	shadow bool
}

// ruleLog is one rule's open interval.
type ruleLog struct {
	key    ruleLogKey
	open   atomic.Bool
	more   atomic.Int64 // refusals after the first, this interval
	opened time.Time    // when the interval opened (set before open is published)
}

// first reports whether this refusal opens an interval, and so is logged
// whole; otherwise it is counted for the interval's summary line.
func (l *refusalLog) first(rule string, shadow bool, every time.Duration, log *slog.Logger) bool {
	k := ruleLogKey{rule, shadow}
	v, ok := l.rules.Load(k)
	if !ok {
		v, _ = l.rules.LoadOrStore(k, &ruleLog{key: k})
	}
	rl := v.(*ruleLog)
	if rl.open.Load() || !rl.open.CompareAndSwap(false, true) {
		rl.more.Add(1)
		return false
	}
	if every <= 0 {
		every = DefaultRefusalLogInterval
	}
	rl.opened = time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return true // closing: no interval to summarize
	}
	if l.timers == nil {
		l.timers = map[*ruleLog]*time.Timer{}
	}
	l.firing.Add(1)
	l.timers[rl] = time.AfterFunc(every, func() {
		defer l.firing.Done()
		l.mu.Lock()
		delete(l.timers, rl)
		l.mu.Unlock()
		l.summarize(rl, log)
	})
	return true
}

// summarize ends rl's interval with a line counting the refusals after its
// first, if there were any.
func (l *refusalLog) summarize(rl *ruleLog, log *slog.Logger) {
	n := rl.more.Swap(0)
	since := rl.opened
	rl.open.Store(false) // a refusal between the Swap and here is counted in the next interval
	if n == 0 {
		return
	}
	log.Info("sketchproxy refusals", "rule", rl.key.rule, "shadow", rl.key.shadow,
		"more_refusals", n, "since", since.UTC().Format(time.RFC3339), "seconds", time.Since(since).Round(time.Millisecond).Seconds())
}

// flush ends every open interval now (Close) and returns when every
// summary line is written: no count is lost at a shutdown.
func (l *refusalLog) flush(log *slog.Logger) {
	l.mu.Lock()
	l.closed = true
	open := l.timers
	l.timers = nil
	l.mu.Unlock()
	for rl, t := range open {
		if t.Stop() { // not fired: summarize here
			l.summarize(rl, log)
			l.firing.Done()
		}
	}
	l.firing.Wait() // timers that fired before Stop
}
