package limit_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
)

// fakeTime runs the sleeps of a Limiter's Wait on its ManualClock, as
// timers on an idle machine would run: a sleeper wakes when the clock
// reaches its time, and the clock moves, to the earliest sleeper's time,
// only once every goroutine of the test that may call Wait is blocked:
// asleep, or in key's queue behind its head. So which goroutine is
// admitted, and when, depends on Wait alone, not on the scheduler.
type fakeTime struct {
	t      *testing.T
	l      *limit.Limiter
	clk    *epochsketch.ManualClock
	key    string
	active atomic.Int64 // goroutines that may still call Wait

	mu       sync.Mutex
	sleepers []*sleeper
}

type sleeper struct {
	at   time.Time
	wake chan struct{}
}

func newFakeTime(t *testing.T, l *limit.Limiter, clk *epochsketch.ManualClock, key string) *fakeTime {
	f := &fakeTime{t: t, l: l, clk: clk, key: key}
	limit.SetSleep(l, f.sleep)
	return f
}

func (f *fakeTime) sleep(ctx context.Context, d time.Duration) error {
	s := &sleeper{at: f.clk.Now().Add(d), wake: make(chan struct{})}
	f.mu.Lock()
	f.sleepers = append(f.sleepers, s)
	f.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		f.mu.Lock()
		f.sleepers = slices.DeleteFunc(f.sleepers, func(x *sleeper) bool { return x == s })
		f.mu.Unlock()
		return ctx.Err()
	}
}

// settle waits until every active goroutine is blocked, and reports
// whether any is (false: none is active). A goroutine blocked on anything
// else fails the test after 10 s.
func (f *fakeTime) settle() bool {
	for start := time.Now(); ; runtime.Gosched() {
		active := int(f.active.Load())
		if active == 0 {
			return false
		}
		f.mu.Lock()
		asleep := len(f.sleepers)
		f.mu.Unlock()
		// The head of the queue is asleep or running; those behind it are
		// blocked.
		if asleep > 0 && asleep+max(limit.Waiting(f.l, f.key)-1, 0) == active {
			return true
		}
		if time.Since(start) > 10*time.Second {
			f.t.Fatalf("stuck: %d active, %d asleep, %d waiting", active, asleep, limit.Waiting(f.l, f.key))
		}
	}
}

// step waits until every active goroutine is blocked, moves the clock to
// the earliest sleeper's time and wakes the sleepers due then. It reports
// false when no goroutine is active.
func (f *fakeTime) step() bool {
	if !f.settle() {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	at := f.sleepers[0].at
	for _, s := range f.sleepers {
		if s.at.Before(at) {
			at = s.at
		}
	}
	if at.After(f.clk.Now()) {
		f.clk.Set(at)
	}
	f.sleepers = slices.DeleteFunc(f.sleepers, func(s *sleeper) bool {
		if s.at.After(at) {
			return false
		}
		close(s.wake)
		return true
	})
	return true
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); runtime.Gosched() {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("never: %s", what)
		}
	}
}

// release is one Wait that returned nil: which caller, and when.
type release struct {
	who int
	at  time.Duration // since the test's start
}

func (r release) String() string { return fmt.Sprintf("{%d %v}", r.who, r.at) }

// releases records the releases of concurrent callers.
type releases struct {
	mu   sync.Mutex
	list []release
}

func (r *releases) add(who int, at time.Duration) {
	r.mu.Lock()
	r.list = append(r.list, release{who, at})
	r.mu.Unlock()
}

// maxIn is the most releases at or after from within any closed window of
// length w.
func maxIn(rs []release, from, w time.Duration) int {
	most := 0
	for i, r := range rs {
		if r.at < from {
			continue
		}
		n := 0
		for _, s := range rs[i:] {
			if s.at-r.at <= w {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// TestWaitFair: 8 goroutines calling Wait on one key at 20 per second for
// 5 s (the load) share it fairly and are released at its pace.
// After the key's burst, which Wait serves as fast as Decide admits, the
// waiters take turns: each gets 12 ± 2 of the 100 or so releases (within
// one of each other), and no 50 ms holds more than 2 releases, where a
// loop on Decide and RetryAfter released them in batches at each tick.
// On a ManualClock that moves only when all 8 are blocked (fakeTime).
func TestWaitFair(t *testing.T) {
	const workers, span = 8, 5 * time.Second
	l, clk := newManual(t, limit.Config{Requests: 20, Per: time.Second})
	start := clk.Now().Add(450 * time.Millisecond) // 50 ms before a tick: 100 paced releases in 5 s
	clk.Set(start)
	f := newFakeTime(t, l, clk, "k")
	var rs releases
	f.active.Store(workers)
	for w := range workers {
		go func() {
			defer f.active.Add(-1)
			for clk.Now().Sub(start) < span {
				if err := l.Wait(context.Background(), "k"); err != nil {
					t.Error(err)
					return
				}
				rs.add(w, clk.Now().Sub(start))
			}
		}()
	}
	for f.step() {
	}
	var burst int
	for _, r := range rs.list {
		if r.at > 0 {
			break
		}
		burst++
	}
	per := make([]int, workers)
	paced := 0
	for _, r := range rs.list[burst:] {
		if r.at < span {
			per[r.who]++
			paced++
		}
	}
	t.Logf("burst %d at once, then %d paced releases in %v: %v a worker", burst, paced, span, per)
	if burst != 20 {
		t.Errorf("%d released at once, want the Burst, 20", burst)
	}
	if paced < 99 || paced > 101 {
		t.Errorf("%d released after the burst in %v, want 100 (20 a second)", paced, span)
	}
	for w, n := range per {
		if n < 10 || n > 14 || n > slices.Min(per)+1 {
			t.Errorf("worker %d: %d releases after the burst (all: %v), want 12 ± 2 and within one of each other", w, n, per)
		}
	}
	if n := maxIn(rs.list, time.Nanosecond, 50*time.Millisecond); n > 2 {
		t.Errorf("%d releases within 50 ms after the burst, want at most 2", n)
	}
}

// TestWaitLoop: one goroutine calling Wait in a loop is paced too: after
// the burst, one release every 50 ms (20 a second) at most. Between its calls the Limiter keeps
// one empty queue for the pacing, not one more a call, and none once the
// pacing has passed.
func TestWaitLoop(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 20, Per: time.Second})
	start := clk.Now()
	limit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		clk.Advance(d)
		return nil
	})
	var at []time.Duration
	for range 60 {
		if err := l.Wait(context.Background(), "k"); err != nil {
			t.Fatal(err)
		}
		at = append(at, clk.Now().Sub(start))
		if n, idle := limit.Queues(l); n > 1 || idle > 1 {
			t.Fatalf("%d queues (%d idle) between calls, want at most 1", n, idle)
		}
	}
	// The burst at once; then the first release when the count leaves
	// room (28 ms on: counts decay smoothly), and never two within 50 ms.
	if at[19] != 0 || at[20] <= 0 || at[20] > 100*time.Millisecond {
		t.Fatalf("the burst, then the first release at %v: want 20 at once, then one within 100 ms (all: %v)", at[20], at)
	}
	for i := 21; i < len(at); i++ {
		if d := at[i] - at[i-1]; d < 50*time.Millisecond || d > 60*time.Millisecond {
			t.Fatalf("release %d %v after the one before, want 50 to 60 ms: one every 50 ms at most (all: %v)", i, d, at)
		}
	}
	clk.Advance(time.Second)
	if err := l.Wait(context.Background(), "other"); err != nil {
		t.Fatal(err)
	}
	if n, idle := limit.Queues(l); n != 0 || idle != 0 {
		t.Fatalf("%d queues (%d idle) once the pacing has passed, want 0", n, idle)
	}
}

// queueUp starts Wait callers 0 to n-1 on key, each once it is in the
// queue behind the one before, with contexts of their own, and returns
// their cancel functions and where their errors arrive.
func queueUp(t *testing.T, f *fakeTime, rs *releases, start time.Time, n int) ([]context.CancelFunc, []chan error) {
	t.Helper()
	cancels := make([]context.CancelFunc, n)
	errs := make([]chan error, n)
	f.active.Add(int64(n))
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		cancels[i], errs[i] = cancel, make(chan error, 1)
		go func() {
			defer f.active.Add(-1)
			err := f.l.Wait(ctx, f.key)
			if err == nil {
				rs.add(i, f.clk.Now().Sub(start))
			}
			errs[i] <- err
		}()
		waitFor(t, fmt.Sprintf("caller %d queued", i), func() bool { return limit.Waiting(f.l, f.key) == i+1 })
	}
	return cancels, errs
}

// TestWaitFIFO: callers waiting on one key at its limit are released in
// the order they came, one per Per/Requests (100 ms) at most.
func TestWaitFIFO(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 10, Per: time.Second}) // a tick of 500 ms
	start := clk.Now()
	l.AllowN(time.Time{}, "k", 10)
	f := newFakeTime(t, l, clk, "k")
	var rs releases
	queueUp(t, f, &rs, start, 5)
	for f.step() {
	}
	if len(rs.list) != 5 || rs.list[0].at <= 0 || rs.list[0].at > 100*time.Millisecond {
		t.Fatalf("released %v: want 5, the first when the count leaves room", rs.list)
	}
	for i, r := range rs.list {
		if r.who != i || i > 0 && (r.at-rs.list[i-1].at < 100*time.Millisecond || r.at-rs.list[i-1].at > 110*time.Millisecond) {
			t.Fatalf("released %v: want callers 0 to 4 in order, 100 to 110 ms apart", rs.list)
		}
	}
}

// TestWaitCancel: a caller whose context ends leaves the queue at once
// and counts nothing, and the callers behind it move up without delay: a
// cancelled head's successor is released when the head would have been,
// and a waiter behind a cancelled one one interval after the release
// before it, not two. Once the queue is empty and its pacing has passed,
// the Limiter holds no queue.
func TestWaitCancel(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 10, Per: time.Second})
	start := clk.Now()
	l.AllowN(time.Time{}, "k", 10)
	f := newFakeTime(t, l, clk, "k")
	var rs releases
	cancels, errs := queueUp(t, f, &rs, start, 5)
	gone := func(i, left int) {
		t.Helper()
		cancels[i]()
		if err := <-errs[i]; !errors.Is(err, context.Canceled) {
			t.Fatalf("caller %d: %v, want context.Canceled", i, err)
		}
		waitFor(t, fmt.Sprintf("%d left after caller %d", left, i), func() bool { return limit.Waiting(l, "k") == left })
	}
	// The head would be released when the count leaves room for one (a
	// control limiter with the same history says when).
	first := l.Decide(time.Time{}, "k", 0).RetryAfter
	if first == 0 {
		ctl, _ := newManual(t, limit.Config{Requests: 10, Per: time.Second})
		ctl.AllowN(start, "k", 10)
		first = ctl.Decide(start, "k", 1).RetryAfter
	}
	gone(2, 4) // behind the head
	f.settle()
	gone(0, 3) // the head, asleep until the count leaves room
	f.step()   // then: caller 1 in 0's place
	f.settle() // caller 3 is the head, asleep for its pacing
	gone(3, 1) // the head again, this time asleep for its pacing
	for f.step() {
	}
	// Caller 1 when the head would have been; caller 4 after the pacing
	// (100 ms), or at the step after it where its room comes.
	if len(rs.list) != 2 || rs.list[0] != (release{1, first}) || rs.list[1].who != 4 ||
		rs.list[1].at < first+100*time.Millisecond || rs.list[1].at > first+110*time.Millisecond {
		t.Fatalf("released %v, want caller 1 at %v and 4 100 to 110 ms later: the cancelled callers' places taken without delay", rs.list, first)
	}
	// The cancelled callers counted nothing: the key reads as one that
	// had its burst and the two released requests only.
	ctl, _ := newManual(t, limit.Config{Requests: 10, Per: time.Second})
	ctl.AllowN(start, "k", 10)
	ctl.AllowN(start.Add(first), "k", 1)
	ctl.AllowN(start.Add(rs.list[1].at), "k", 1)
	if r, want := remaining(l, "k"), ctl.Decide(clk.Now(), "k", 0).Remaining; r != want {
		t.Fatalf("%d left after the releases, want %d as for the burst and 2 requests: the cancelled callers counted", r, want)
	}
	if n, idle := limit.Queues(l); n != 1 || idle != 1 {
		t.Fatalf("%d queues (%d idle) while the pacing holds, want 1 (1)", n, idle)
	}
	clk.Set(start.Add(700 * time.Millisecond))
	if err := l.Wait(context.Background(), "other"); err != nil {
		t.Fatal(err)
	}
	if n, idle := limit.Queues(l); n != 0 || idle != 0 {
		t.Fatalf("%d queues (%d idle) with no callers and no pacing left, want 0", n, idle)
	}
}

// TestWaitQueueFull: 4,096 callers may wait for one key; one more is
// refused at once with an error that says so, and once they leave the
// Limiter holds no queue.
func TestWaitQueueFull(t *testing.T) {
	l, _ := newManual(t, limit.Config{Requests: 1, Per: time.Hour})
	l.Allow("k")
	limit.SetSleep(l, func(ctx context.Context, d time.Duration) error {
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4096 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Wait(ctx, "k"); !errors.Is(err, context.Canceled) {
				t.Errorf("%v, want context.Canceled", err)
			}
		}()
	}
	waitFor(t, "4096 waiting", func() bool { return limit.Waiting(l, "k") == 4096 })
	full, cancelFull := context.WithTimeout(context.Background(), time.Minute) // not to hang if it queues
	defer cancelFull()
	err := l.Wait(full, "k")
	if err == nil || !strings.Contains(err.Error(), "4096 callers already wait for this key") {
		t.Errorf("the 4097th caller: %v, want a full queue", err)
	}
	if err := l.Wait(context.Background(), "another"); err != nil {
		t.Errorf("another key: %v", err)
	}
	cancel()
	wg.Wait()
	if n, idle := limit.Queues(l); n != 0 || idle != 0 {
		t.Fatalf("%d queues (%d idle) after every caller left, want 0", n, idle)
	}
}

// TestWaitDeadlineInQueue: a caller whose deadline comes before its turn
// could, one interval (30 min) behind a head waiting for the key, is told
// so at once and not queued.
func TestWaitDeadlineInQueue(t *testing.T) {
	l, clk := newManual(t, limit.Config{Requests: 2, Per: time.Hour})
	l.AllowN(time.Time{}, "k", 2)
	f := newFakeTime(t, l, clk, "k")
	var rs releases
	queueUp(t, f, &rs, clk.Now(), 1)
	f.settle()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	if err := l.Wait(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "beyond the context's deadline") {
		t.Fatalf("%v, want the deadline at once", err)
	}
	if n := limit.Waiting(l, "k"); n != 1 {
		t.Fatalf("%d waiting, want 1: the late caller was queued", n)
	}
	for f.step() {
	}
}

// TestWaitWallClock is TestWaitFair on the wall clock, for 5 s: each of 8
// workers gets 12 ± 2 of the releases after the burst, and no 50 ms holds
// more than 2 of them, with the timers' lateness.
func TestWaitWallClock(t *testing.T) {
	if testing.Short() {
		t.Skip("5 s on the wall clock")
	}
	const workers, span = 8, 5 * time.Second
	l := limit.New(20, time.Second)
	defer l.Close()
	var rs releases
	start := time.Now()
	// The deadline ends the callers still queued at 5 s at once.
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(span))
	defer cancel()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if err := l.Wait(ctx, "k"); err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
					}
					return
				}
				rs.add(w, time.Since(start))
			}
		}()
	}
	wg.Wait()
	// The burst is what was released before the first release more than
	// 10 ms after the one before it.
	burst := len(rs.list)
	for i := 1; i < len(rs.list); i++ {
		if rs.list[i].at-rs.list[i-1].at > 10*time.Millisecond {
			burst = i
			break
		}
	}
	per := make([]int, workers)
	for _, r := range rs.list[burst:] {
		if r.at < span {
			per[r.who]++
		}
	}
	from := time.Duration(0)
	if burst < len(rs.list) {
		from = rs.list[burst].at
	}
	most := maxIn(rs.list, from, 50*time.Millisecond)
	t.Logf("burst %d, then %v a worker; at most %d in 50 ms after the burst", burst, per, most)
	for w, n := range per {
		if n < 10 || n > 14 {
			t.Errorf("worker %d: %d releases after the burst (all: %v), want 12 ± 2", w, n, per)
		}
	}
	if most > 2 {
		t.Errorf("%d releases within 50 ms after the burst, want at most 2", most)
	}
}
