package limit

import (
	"context"
	"time"
)

// SetSleep replaces the wait of l's Wait, so that tests move a
// ManualClock instead of sleeping.
func SetSleep(l *Limiter, f func(ctx context.Context, d time.Duration) error) { l.sleep = f }
