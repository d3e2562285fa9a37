package sketchproxy

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// exactLimiter is the same decision with exact per-key counts: an unbounded
// map, the same tick, threshold and smooth decay of counts (rate.Unit per
// request, Scale(j) internal counts each in step j of a tick). The
// difference from the proxy is only what the sketch's fixed memory costs.
type exactLimiter struct {
	lim   rate.Limit // its tick and steps
	theta uint64     // in counts
	free  bool       // refused requests do not count
	m     map[string]exactCount
}

type exactCount struct {
	c uint64
	t int64
}

func (e *exactLimiter) observe(key string, now time.Time) (bool, uint64) {
	tk := now.UnixNano() / int64(e.lim.Tick)
	sc := uint64(e.lim.Scale(now))
	x := e.m[key]
	c := uint64(0) // internal counts
	if age := tk - x.t; age < 64 {
		c = x.c >> age
	}
	ok := c+rate.Unit*sc <= e.theta*sc
	if ok || !e.free {
		c += rate.Unit * sc
	}
	e.m[key] = exactCount{c, tk}
	return ok, (c + sc - 1) / sc / rate.Unit
}

// slidingLog is the textbook exact limiter: at most L requests (counted
// whether allowed or not) in any window of length per.
type slidingLog struct {
	per  time.Duration
	l    int
	free bool // refused requests do not count
	m    map[string][]time.Time
}

func (s *slidingLog) observe(key string, now time.Time) (bool, int) {
	q := s.m[key]
	for len(q) > 0 && now.Sub(q[0]) >= s.per {
		q = q[1:]
	}
	ok := len(q)+1 <= s.l
	if ok || !s.free {
		q = append(q, now)
	}
	s.m[key] = q
	return ok, len(q)
}

type accuracy struct {
	requests, wrongAllowed, wrongLimited int
	slideAllowed, slideLimited           int
	keys                                 int
	// Mean relative difference of the proxy's estimate from the exact
	// same-math count, and from the requests in the last minute (the rate
	// a sliding window sees), over requests from keys past a tenth of the
	// limit: Cloudflare's "mean difference between real and estimated rate".
	errSame, errWindow float64
	nErr               int
}

// replayTrace runs an arrival trace through the proxy's decision and both
// exact limiters: 100 requests per minute per client (burst 100), on a
// sketch of the given size. Clients: a Zipf crowd of 50,000 with rates from
// far under to 3x the limit, 20 heavy hitters at 5x, and a flood of mice
// that each send once (an address-rotation attack) at floodShare of the
// requests.
func replayTrace(t testing.TB, n int, buckets int, floodShare float64, seed uint64, refused string) accuracy {
	clk := epochsketch.NewManualClock(time.Unix(1_700_000_000, 0))
	cfg, err := ParseConfig("acc", []byte(fmt.Sprintf("sketch: {buckets: %d}\nnew_keys: {disabled: true}\nrules:\n  - name: a\n    key: [\"header:X-Key\"]\n    refused: %s\n    limits: [{name: m, requests: 100, per: 1m}]\n", buckets, refused)))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), Options{Clock: clk, Seed: seed, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	ru := mw.state.Load().rules[0].eng
	lim := ru.Limits[0]
	free := refused == "free"
	ex := &exactLimiter{lim: lim.Limit, theta: uint64(lim.Threshold), free: free, m: map[string]exactCount{}}
	sl := &slidingLog{per: time.Minute, l: 100, free: free, m: map[string][]time.Time{}}
	r := rand.New(rand.NewPCG(seed, 1))
	zipf := rand.NewZipf(r, 1.2, 1, 49_999)
	via := newVia(mw)
	var a accuracy
	// The crowd's total rate: 4,000 requests a second.
	gap := time.Second / 4000
	mice := 0
	for i := range n {
		var key string
		switch x := r.Float64(); {
		case x < floodShare:
			mice++
			key = "mouse" + strconv.Itoa(mice)
		case x < floodShare+0.05:
			key = "heavy" + strconv.Itoa(r.IntN(20))
		default:
			key = "user" + strconv.FormatUint(zipf.Uint64(), 10)
		}
		now := clk.Now()
		allowed := via.serve("X-Key", key) == http.StatusOK
		est := mw.eng.Estimate(ru, lim, key) // what the proxy's decision leaves
		e, exact := ex.observe(key, now)
		s, window := sl.observe(key, now)
		if window >= 10 {
			a.errSame += math.Abs(float64(est)-float64(exact)) / float64(exact)
			a.errWindow += math.Abs(float64(est)-float64(window)) / float64(window)
			a.nErr++
		}
		if e != allowed {
			if allowed {
				a.wrongAllowed++
			} else {
				a.wrongLimited++
			}
		}
		if s != allowed {
			if allowed {
				a.slideAllowed++
			} else {
				a.slideLimited++
			}
		}
		a.requests++
		clk.Advance(gap)
		if i%100_000 == 0 { // bound the sliding log's memory
			for k, q := range sl.m {
				if len(q) > 0 && now.Sub(q[len(q)-1]) > time.Minute {
					delete(sl.m, k)
				}
			}
		}
	}
	a.keys = len(ex.m)
	return a
}

func pct(n, d int) float64 { return 100 * float64(n) / float64(d) }

// The proxy's decisions against an exact limiter with the same math, on a
// trace with a crowd, heavy hitters and a mouse flood. Reported, and held
// under 0.1% wrong.
func TestAccuracyAgainstExactLimiter(t *testing.T) {
	n := 400_000 / raceScale
	if testing.Short() {
		n /= 4 // the wrong-decision bound holds at this size too; make test-long runs the whole trace
	}
	if s := os.Getenv("SKETCHPROXY_ACCURACY_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	for _, c := range []struct {
		refused string
		buckets int
		flood   float64
	}{
		{"free", 1 << 16, 0}, {"free", 1 << 16, 0.5}, {"free", 1 << 10, 0.5}, {"free", 1 << 6, 0}, {"free", 1 << 6, 0.5},
		{"count", 1 << 16, 0}, {"count", 1 << 16, 0.5}, {"count", 1 << 10, 0.5}, {"count", 1 << 6, 0}, {"count", 1 << 6, 0.5},
	} {
		a := replayTrace(t, n, c.buckets, c.flood, 1, c.refused)
		wrong := pct(a.wrongAllowed+a.wrongLimited, a.requests)
		t.Logf("refused: %s, buckets %d (%d KiB), flood %.0f%%: %d requests, %d keys: vs exact same-math limiter %.4f%% wrong (%.4f%% wrongly allowed, %.4f%% wrongly limited); vs exact sliding window %.3f%% wrongly allowed, %.3f%% wrongly limited; mean rate difference %.3f%% from the exact count, %.2f%% from the last minute's count",
			c.refused, c.buckets, c.buckets*64/1024, 100*c.flood, a.requests, a.keys, wrong, pct(a.wrongAllowed, a.requests), pct(a.wrongLimited, a.requests),
			pct(a.slideAllowed, a.requests), pct(a.slideLimited, a.requests), 100*a.errSame/float64(max(1, a.nErr)), 100*a.errWindow/float64(max(1, a.nErr)))
		if c.buckets >= 1<<16 && wrong > 0.1 {
			t.Errorf("%.4f%% wrong decisions at 4 MiB", wrong)
		}
	}
}

// Memory stays flat under an address flood: the heap after a flood of
// distinct client addresses is what it was after the first thousand.
func TestFlatMemoryUnderAddressFlood(t *testing.T) {
	n := 1_000_000 / raceScale
	if s := os.Getenv("SKETCHPROXY_FLOOD_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	cfg, err := ParseConfig("flood", []byte("client_ip: {trusted_proxies: [10.0.0.0/8]}\nrules:\n  - name: ip\n    tarpit: true\n    limits: [{requests: 100, per: 1m}, {name: day, requests: 10000, per: 1d}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	via := newVia(mw)
	addr := func(i int) string {
		return fmt.Sprintf("%d.%d.%d.%d", 1+i>>24&0x7f, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	for i := range 1000 {
		via.serve("X-Forwarded-For", addr(i))
	}
	before := heap()
	for i := 1000; i < n; i++ {
		via.serve("X-Forwarded-For", addr(i))
	}
	after := heap()
	t.Logf("%d distinct addresses: heap %.2f MiB after 1,000, %.2f MiB after all", n, float64(before)/(1<<20), float64(after)/(1<<20))
	if after > before+1<<20 {
		t.Errorf("the heap grew %d bytes under the flood", after-before)
	}
}

// The same through ServeHTTP, the whole request path: distinct client
// addresses arrive in X-Forwarded-For from a trusted proxy.
func TestFlatMemoryThroughServeHTTP(t *testing.T) {
	n := 300_000 / raceScale
	if s := os.Getenv("SKETCHPROXY_FLOOD_HTTP_N"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	cfg, err := ParseConfig("flood", []byte("client_ip: {trusted_proxies: [10.0.0.0/8]}\nrules:\n  - name: ip\n    tarpit: true\n    limits: [{requests: 100, per: 1m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	w := &discardWriter{h: http.Header{}}
	serve := func(i int) {
		r.Header.Set("X-Forwarded-For", fmt.Sprintf("%d.%d.%d.%d", 1+i>>24&0x7f, i>>16&0xff, i>>8&0xff, i&0xff))
		clear(w.h)
		mw.ServeHTTP(w, r)
	}
	for i := range 1000 {
		serve(i)
	}
	before := heap()
	for i := 1000; i < n; i++ {
		serve(i)
	}
	after := heap()
	t.Logf("%d requests from distinct addresses through ServeHTTP: heap %.2f MiB after 1,000, %.2f MiB after all", n, float64(before)/(1<<20), float64(after)/(1<<20))
	if after > before+1<<20 {
		t.Errorf("the heap grew %d bytes", after-before)
	}
}

type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(code int)        { d.code = code }

// heap is the live heap after a collection.
func heap() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// via sends requests through the Middleware's whole ServeHTTP, the code
// that runs, reusing one request, and reads the status.
type via struct {
	mw *Middleware
	r  *http.Request
	w  *discardWriter
}

func newVia(mw *Middleware) *via {
	r, _ := http.NewRequest("GET", "http://x/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	return &via{mw: mw, r: r, w: &discardWriter{h: http.Header{}}}
}

// serve sends one request with header name set to value.
func (v *via) serve(name, value string) int {
	v.r.Header.Set(name, value)
	clear(v.w.h)
	v.w.code = http.StatusOK
	v.mw.ServeHTTP(v.w, v.r)
	return v.w.code
}
