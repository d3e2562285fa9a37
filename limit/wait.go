package limit

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
)

// maxWaiters is the most WaitN calls that may wait for one key at once;
// one more returns at once with an error that says so. At 10 requests a
// second the last of 4,096 waits 410 s, far past any request's deadline,
// so a queue this long means callers arrive faster than the limit lets
// them through, and more goroutines would only hold more memory.
const maxWaiters = 4096

// waiters holds the queues of the keys that have WaitN callers. Only WaitN
// takes mu: Allow, AllowN and Decide never do.
type waiters struct {
	mu     sync.Mutex
	queues map[string]*queue
	// idle holds the queues that emptied while their pacing still held
	// (queue.next in the future), earliest first, so that WaitN deletes
	// them once it has passed.
	idle idleHeap
}

// queue is one key's WaitN callers, in arrival order: only the head tries
// Decide, the others wait for their turn. Its fields are guarded by
// waiters.mu.
type queue struct {
	key        string
	head, tail *waiter
	len        int // waiters
	requests   int // the n of all waiters, for the deadline's estimate
	// paced says a head was refused: the key reached its limit, and from
	// then on, for as long as the queue lives, releases are spaced by the
	// limit's interval. Until then the key's room (its burst) is served
	// as fast as Decide admits.
	paced bool
	// next is, once paced, the earliest the head may try Decide: the last
	// release plus its n × Per/Requests. It never moves back.
	next time.Time
	// idleAt is when pruneLocked looks at the queue again, while it is
	// in idle (index >= 0): at most next, which may have moved on since.
	idleAt time.Time
	index  int // in idle, or -1
}

// idleHeap is a container/heap of queues, earliest idleAt first.
type idleHeap []*queue

func (h idleHeap) Len() int           { return len(h) }
func (h idleHeap) Less(i, j int) bool { return h[i].idleAt.Before(h[j].idleAt) }
func (h idleHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *idleHeap) Push(x any) {
	q := x.(*queue)
	q.index = len(*h)
	*h = append(*h, q)
}
func (h *idleHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.index = -1
	return q
}

// waiter is one WaitN call in its key's queue.
type waiter struct {
	prev, next *waiter
	n          int
	turn       chan struct{} // closed when it becomes the head
}

// interval is the time n requests take at the limit's rate, n × Per /
// Requests, at most the longest Duration.
func (l *Limiter) interval(n int) time.Duration {
	d := float64(l.lim.Per) * float64(n) / l.lim.Requests
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// enqueue puts a waiter for n requests of key at the end of key's queue,
// and makes it the head if the queue was empty. It fails, queueing
// nothing, when the queue is full, and when ctx's deadline comes before
// the waiter's turn could: the waiters ahead need their intervals even if
// the key has room.
func (l *Limiter) enqueue(ctx context.Context, key string, n int) (*queue, *waiter, error) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	now := l.now()
	l.pruneLocked(now)
	q := l.w.queues[key]
	if q == nil {
		if l.w.queues == nil {
			l.w.queues = make(map[string]*queue)
		}
		q = &queue{key: key, index: -1}
		l.w.queues[key] = q
	}
	if q.len >= maxWaiters {
		return nil, nil, fmt.Errorf("limit: WaitN(%d): %d callers already wait for this key, the most that may; try again later", n, maxWaiters)
	}
	if dl, ok := ctx.Deadline(); ok && q.paced {
		// The head is released at q.next at the earliest (now, before
		// the queue's first release), and each waiter one interval of
		// its requests after the one ahead.
		base := q.next
		if base.IsZero() {
			base = now
		}
		wait := base.Sub(now)
		if d := l.interval(q.requests); wait < math.MaxInt64-d {
			wait += d
		} else {
			wait = math.MaxInt64
		}
		if wait > 0 && time.Until(dl) < wait {
			// q is new only if unpaced, so it needs no cleaning up here.
			return nil, nil, fmt.Errorf("limit: WaitN(%d): at least %v until the requests fit, beyond the context's deadline: %w", n, wait, context.DeadlineExceeded)
		}
	}
	w := &waiter{n: n, turn: make(chan struct{}), prev: q.tail}
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
		close(w.turn)
	}
	q.tail = w
	q.len++
	q.requests += n
	return q, w, nil
}

// leave takes w out of q, whether it was admitted or gave up; if w was the
// head, the next waiter becomes the head at once.
func (l *Limiter) leave(q *queue, w *waiter) {
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
		if q.head != nil {
			close(q.head.turn)
		}
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.len--
	q.requests -= w.n
	if q.len == 0 {
		l.emptiedLocked(q, l.now())
	}
}

// emptiedLocked deletes the empty queue q, or keeps it in idle while its
// pacing holds, so that a caller who comes back at once (one goroutine
// calling Wait in a loop) is still paced.
func (l *Limiter) emptiedLocked(q *queue, now time.Time) {
	if q.paced && q.next.After(now) {
		if q.index < 0 {
			q.idleAt = q.next
			heap.Push(&l.w.idle, q)
		}
		return
	}
	if l.w.queues[q.key] == q {
		delete(l.w.queues, q.key)
	}
}

// pruneLocked deletes the idle queues whose pacing has passed. A queue
// that has waiters again only leaves idle (it returns when it empties
// again); one whose pacing moved on is looked at again then.
func (l *Limiter) pruneLocked(now time.Time) {
	for len(l.w.idle) > 0 && !l.w.idle[0].idleAt.After(now) {
		q := l.w.idle[0]
		if q.len == 0 && q.next.After(now) {
			q.idleAt = q.next
			heap.Fix(&l.w.idle, 0)
			continue
		}
		heap.Pop(&l.w.idle)
		if q.len == 0 && l.w.queues[q.key] == q {
			delete(l.w.queues, q.key)
		}
	}
}

// serve is the head's part of WaitN: wait for the pacing, try Decide, and
// on a refusal wait what it says and try again. It returns nil once the
// requests are admitted and the pacing for the next head is set.
func (l *Limiter) serve(ctx context.Context, q *queue, key string, n int) error {
	var paced time.Time // the pacing instant this head slept to, if any
	for {
		now := l.now()
		l.w.mu.Lock()
		next := q.next
		l.w.mu.Unlock()
		if wait := next.Sub(now); wait > 0 {
			if err := l.sleepWithin(ctx, n, wait); err != nil {
				return err
			}
			paced = next
			continue
		}
		d := l.Decide(now, key, n)
		if d.Allowed {
			l.w.mu.Lock()
			if q.paced {
				// Space the next release from the instant this one was
				// due, when it was admitted there (a timer's lateness is
				// not lost from the rate); else from now.
				base := now
				if !paced.IsZero() && now.Sub(paced) < l.interval(n) {
					base = paced
				}
				q.next = base.Add(l.interval(n))
			}
			l.w.mu.Unlock()
			return nil
		}
		if d.RetryAfter == 0 {
			// It fits now: the add lost its compare-and-swaps to racing
			// writers (Stats.Contended). Try again after them.
			runtime.Gosched()
			continue
		}
		paced = time.Time{}
		l.w.mu.Lock()
		q.paced = true
		l.w.mu.Unlock()
		if err := l.sleepWithin(ctx, n, d.RetryAfter); err != nil {
			return err
		}
	}
}

// sleepWithin is sleep, but fails at once, without waiting, with an error
// that wraps context.DeadlineExceeded when ctx's deadline comes first.
func (l *Limiter) sleepWithin(ctx context.Context, n int, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return fmt.Errorf("limit: WaitN(%d): %v until the requests fit, beyond the context's deadline: %w", n, d, context.DeadlineExceeded)
	}
	return l.sleep(ctx, d)
}

// sleep waits d, or until ctx ends, with a timer.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
