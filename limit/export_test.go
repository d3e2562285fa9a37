package limit

import (
	"context"
	"time"
)

// SetSleep replaces the wait of l's Wait, so that tests move a
// ManualClock instead of sleeping.
func SetSleep(l *Limiter, f func(ctx context.Context, d time.Duration) error) { l.sleep = f }

// Waiting is how many WaitN calls are in key's queue: its head and the
// callers behind it.
func Waiting(l *Limiter, key string) int {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	if q := l.w.queues[key]; q != nil {
		return q.len
	}
	return 0
}

// Queues is how many keys' queues l holds, empty ones kept for their
// pacing included, and how many of them it keeps for their pacing.
func Queues(l *Limiter) (queues, idle int) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	return len(l.w.queues), len(l.w.idle)
}
