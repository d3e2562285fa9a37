package bench

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/go-chi/httprate"
	sethvargo "github.com/sethvargo/go-limiter"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululememory "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
)

// RateLimiter is one per-key rate limiter, as a Go program would use it:
// Allow on the wall clock, AllowAt at an explicit time (for replays that
// run a minute of traffic in milliseconds). Both count an admitted request.
type RateLimiter interface {
	Allow(key string) bool
	AllowAt(t time.Time, key string) bool
}

// LimiterPeer is a named constructor of a limiter for requests per per.
type LimiterPeer struct {
	Name string
	New  func(requests int, per time.Duration) RateLimiter
}

// LimiterPeers are package limit and what Go developers use instead.
var LimiterPeers = []LimiterPeer{
	{"epochsketch-limit", func(n int, per time.Duration) RateLimiter {
		return esLimit{limit.NewWith(limit.Config{Requests: n, Per: per, NumBuckets: TableBuckets})}
	}},
	{"xtime-rate-map", func(n int, per time.Duration) RateLimiter {
		return &rateLimitMap{m: map[string]*rate.Limiter{}, every: rate.Every(per / time.Duration(n)), burst: n}
	}},
	{"httprate-local", func(n int, per time.Duration) RateLimiter { return newHTTPRateLimit(n, per) }},
	{"sethvargo-memorystore", func(n int, per time.Duration) RateLimiter { return newSethvargo(n, per) }},
	{"ulule-memory", func(n int, per time.Duration) RateLimiter { return newUlule(n, per) }},
	{"observe-threshold", func(n int, per time.Duration) RateLimiter {
		return observeThreshold{epochsketch.New(epochsketch.Config{NumBuckets: TableBuckets, TickDuration: per}), uint32(2 * n)}
	}},
}

// observeThreshold is the sketch used as a limiter by hand, the way a new
// user first writes it: Observe, and refuse above twice the limit (a key's
// steady estimate is twice its rate per tick). Refused requests count too.
type observeThreshold struct {
	sk    *epochsketch.Sketch
	theta uint32
}

func (o observeThreshold) Allow(k string) bool { est, _ := o.sk.Observe(k); return est <= o.theta }
func (o observeThreshold) Close() error        { return o.sk.Close() }
func (o observeThreshold) AllowAt(t time.Time, k string) bool {
	est, _ := o.sk.ObserveN(t, k, 1)
	return est <= o.theta
}

type esLimit struct{ l *limit.Limiter }

func (e esLimit) Allow(k string) bool                { return e.l.Allow(k) }
func (e esLimit) AllowAt(t time.Time, k string) bool { return e.l.AllowN(t, k, 1) }
func (e esLimit) Close() error                       { return e.l.Close() }

// rateLimitMap is the usual per-key x/time/rate limiter: a map of
// limiters, burst = the requests per period, under a mutex. (A real one
// also runs a goroutine that sweeps idle keys; until it runs, the map holds
// every key, which is what the heap figure shows.)
type rateLimitMap struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	every rate.Limit
	burst int
}

func (r *rateLimitMap) get(k string) *rate.Limiter {
	r.mu.Lock()
	l, ok := r.m[k]
	if !ok {
		l = rate.NewLimiter(r.every, r.burst)
		r.m[clone(k)] = l
	}
	r.mu.Unlock()
	return l
}

func (r *rateLimitMap) Allow(k string) bool                { return r.get(k).Allow() }
func (r *rateLimitMap) AllowAt(t time.Time, k string) bool { return r.get(k).AllowN(t, 1) }

// httpRateLimit is go-chi/httprate's decision, as its RateLimiter.OnLimit
// (limiter.go, v0.16.1) makes it, around its in-memory LimitCounter: under
// the limiter's mutex, the sliding-window rate from the current and the
// previous window, rounded; refuse if one more passes the limit, else
// increment. OnLimit reads time.Now itself; here the time is a parameter.
type httpRateLimit struct {
	mu     sync.Mutex
	c      httprate.LimitCounter
	limit  int
	window time.Duration
}

func newHTTPRateLimit(n int, per time.Duration) *httpRateLimit {
	c := httprate.NewLocalLimitCounter(per)
	c.Config(n, per)
	return &httpRateLimit{c: c, limit: n, window: per}
}

func (h *httpRateLimit) Allow(k string) bool { return h.AllowAt(time.Now(), k) }

func (h *httpRateLimit) AllowAt(t time.Time, k string) bool {
	t = t.UTC()
	cur := t.Truncate(h.window)
	h.mu.Lock()
	defer h.mu.Unlock()
	c, p, _ := h.c.Get(k, cur, cur.Add(-h.window))
	r := float64(p)*(float64(h.window)-float64(t.Sub(cur)))/float64(h.window) + float64(c)
	if int(math.Round(r))+1 > h.limit {
		return false
	}
	_ = h.c.IncrementBy(k, cur, 1)
	return true
}

// sethvargoLimit is sethvargo/go-limiter's in-memory store (v0.7.1),
// limiter.Store.Take per request, with its defaults beside the limit
// (tokens per interval): a map of token buckets under a read-write lock,
// swept every 6 hours. Take reads the time itself; AllowAt makes the same
// decision at t with a copy of its bucket (memorystore/store.go, bucket.take:
// a bucket's ticks count intervals from its first request, and a tick
// later than its last refills it by whole ticks times interval/tokens,
// capped at tokens).
type sethvargoLimit struct {
	st       sethvargo.Store
	tokens   uint64
	interval time.Duration
	mu       sync.Mutex
	at       map[string]*sethvargoBucket
}

type sethvargoBucket struct{ start, last, avail uint64 }

func newSethvargo(n int, per time.Duration) *sethvargoLimit {
	st, err := memorystore.New(&memorystore.Config{Tokens: uint64(n), Interval: per})
	if err != nil {
		panic(err)
	}
	return &sethvargoLimit{st: st, tokens: uint64(n), interval: per, at: map[string]*sethvargoBucket{}}
}

func (s *sethvargoLimit) Allow(k string) bool {
	_, _, _, ok, err := s.st.Take(context.Background(), k)
	return ok && err == nil
}

func (s *sethvargoLimit) AllowAt(t time.Time, k string) bool {
	now := uint64(t.UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.at[k]
	if !ok {
		b = &sethvargoBucket{start: now, avail: s.tokens}
		s.at[clone(k)] = b
	}
	if tick := (now - b.start) / uint64(s.interval); b.last < tick {
		b.avail = min(uint64(float64(tick-b.last)*float64(s.interval)/float64(s.tokens)), s.tokens)
		b.last = tick
	}
	if b.avail == 0 {
		return false
	}
	b.avail--
	return true
}

func (s *sethvargoLimit) Close() error { return s.st.Close(context.Background()) }

// ululeLimit is ulule/limiter's Limiter on its memory store (v3.11.2),
// Limiter.Get per request: a fixed window per key from its first request,
// a sync.Map of counters swept every 30 s, keys prefixed "limiter:". Get
// counts refused requests too (a window's count only resets when it
// expires) and refuses once the count passes the limit. It reads the time
// itself; AllowAt makes the same decision at t (drivers/store/memory/
// cache.go, Counter.Increment).
type ululeLimit struct {
	l      *ulule.Limiter
	limit  int64
	period time.Duration
	mu     sync.Mutex
	at     map[string]*[2]int64 // count, expiration
}

func newUlule(n int, per time.Duration) *ululeLimit {
	r := ulule.Rate{Period: per, Limit: int64(n)}
	return &ululeLimit{l: ulule.New(ululememory.NewStore(), r), limit: int64(n), period: per, at: map[string]*[2]int64{}}
}

func (u *ululeLimit) Allow(k string) bool {
	c, err := u.l.Get(context.Background(), k)
	return err == nil && !c.Reached
}

func (u *ululeLimit) AllowAt(t time.Time, k string) bool {
	now := t.UnixNano()
	u.mu.Lock()
	defer u.mu.Unlock()
	c, ok := u.at[k]
	if !ok {
		c = new([2]int64)
		u.at[clone(k)] = c
	}
	if c[1] == 0 || now > c[1] {
		c[0], c[1] = 0, now+int64(u.period)
	}
	c[0]++
	return c[0] <= u.limit
}

// Admitted replays one client sending at over times the limit of requests
// per second, evenly, for d from t0, and returns the requests admitted per
// second.
func Admitted(p LimiterPeer, requests, over int, t0 time.Time, d time.Duration) float64 {
	l := p.New(requests, time.Second)
	gap := time.Second / time.Duration(over*requests)
	n := 0
	for t := t0; t.Before(t0.Add(d)); t = t.Add(gap) {
		if l.AllowAt(t, "client") {
			n++
		}
	}
	if c, ok := l.(interface{ Close() error }); ok {
		c.Close()
	}
	return float64(n) / d.Seconds()
}
