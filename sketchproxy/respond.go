package sketchproxy

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// seconds rounds a wait up to whole seconds, at least 1.
func seconds(d time.Duration) int64 {
	return max(1, int64(math.Ceil(d.Seconds())))
}

// setHeaders writes the IETF draft's RateLimit-Policy and RateLimit
// (draft-ietf-httpapi-ratelimit-headers: structured fields) for the most
// constrained limit: r is how many requests the key may send now, t the
// seconds until that grows (the next halving) or, when refused, the
// Retry-After. Legacy X-RateLimit-* follow if configured.
func (m *Middleware) setHeaders(h http.Header, st *state, v *verdict) {
	if v.lim == nil {
		return
	}
	remaining := int64(0)
	if v.theta > v.est {
		remaining = int64(v.theta - v.est)
	}
	t := seconds(v.retry)
	h.Set("RateLimit-Policy", v.ru.policy)
	h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", v.lim.policy, remaining, t))
	if st.cfg.Headers.Legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatUint(uint64(v.theta), 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(t, 10))
	}
}

// problem is an RFC 9457 problem details body.
type problem struct {
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Status     int     `json:"status"`
	Detail     string  `json:"detail"`
	Rule       string  `json:"rule"`
	Limit      string  `json:"limit,omitempty"`
	Outcome    string  `json:"outcome"`
	RetryAfter int64   `json:"retry_after"`
	Level      float64 `json:"level,omitempty"` // estimate / threshold
}

func (m *Middleware) problemFor(st *state, v *verdict, code int) problem {
	p := problem{
		Type: "about:blank", Title: http.StatusText(code), Status: code,
		Rule: v.ru.cfg.Name, Outcome: v.out.String(), RetryAfter: seconds(v.retry),
		Level: math.Round(v.level*100) / 100,
	}
	switch v.out {
	case OverBudget:
		b := v.ru.budget.cfg
		p.Limit = b.Name
		p.Detail = fmt.Sprintf("budget %q of %s units per %v is spent; retry after %d s", b.Name, formatNum(b.Units), time.Duration(b.Per), p.RetryAfter)
	case BudgetUnknown:
		p.Limit = v.ru.budget.cfg.Name
		p.Detail = fmt.Sprintf("budget %q cannot be tracked for this client right now, and the route fails closed; retry after %d s", p.Limit, p.RetryAfter)
	case InFlight:
		p.Detail = fmt.Sprintf("at most %d requests in flight per client on rule %q", v.ru.cfg.MaxInFlight, v.ru.cfg.Name)
	default:
		if v.lim != nil {
			p.Limit = v.lim.name
			p.Detail = fmt.Sprintf("rule %q limit %q: %s requests per %v; retry after %d s", v.ru.cfg.Name, v.lim.name, formatNum(v.lim.requests), v.lim.per, p.RetryAfter)
		}
		if v.out == Ban {
			p.Detail = "temporarily banned: " + p.Detail
		}
	}
	return p
}

// refusal sets a refusal's headers and returns its problem+json body.
func (m *Middleware) refusal(h http.Header, st *state, v *verdict, code int) []byte {
	m.setHeaders(h, st, v)
	h.Set("Retry-After", strconv.FormatInt(seconds(v.retry), 10))
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if v.out == Ban {
		h.Set("Connection", "close")
	}
	body, _ := json.Marshal(m.problemFor(st, v, code))
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return body
}

// refuse writes a refusal at once.
func (m *Middleware) refuse(w http.ResponseWriter, st *state, v *verdict, code int) {
	body := m.refusal(w.Header(), st, v, code)
	w.WriteHeader(code)
	w.Write(body)
}

// drip holds the client with a 429 written a byte at a time, without
// touching the upstream, for at most MaxDelay; with the tarpit at its caps it
// refuses at once.
func (m *Middleware) drip(w http.ResponseWriter, r *http.Request, st *state, v *verdict) {
	if !m.hold(v.ru.cfg.Name, v.key, st) {
		v.out = TarpitFull
		v.ru.met.count(TarpitFull, false)
		m.refuse(w, st, v, http.StatusTooManyRequests)
		return
	}
	defer m.release(v.ru.cfg.Name, v.key)
	t := &st.cfg.Tarpit
	body := m.refusal(w.Header(), st, v, http.StatusTooManyRequests)
	w.WriteHeader(http.StatusTooManyRequests)
	rc := http.NewResponseController(w)
	deadline := time.Duration(t.MaxDelay)
	var spent time.Duration
	i := 0
	for ; i < len(body) && spent+time.Duration(t.DripInterval) <= deadline; i++ {
		if _, err := w.Write(body[i : i+1]); err != nil {
			return
		}
		rc.Flush()
		if err := m.opts.Sleep(r.Context(), time.Duration(t.DripInterval)); err != nil {
			return
		}
		spent += time.Duration(t.DripInterval)
	}
	w.Write(body[i:])
}

// logDecision logs a refusal (or a shadow one), at most logsPerSecond a
// second; the next line says how many were left out.
func (m *Middleware) logDecision(r *http.Request, v *verdict, shadow bool) {
	ok, skipped := m.logs.allow(m.now())
	if !ok {
		return
	}
	attrs := []any{
		"rule", v.ru.cfg.Name, "outcome", v.out.String(), "shadow", shadow,
		"key", v.ru.display(v.key), "method", r.Method, "path", truncate(r.URL.Path, 256),
		"retry_after_s", seconds(v.retry),
	}
	if v.lim != nil {
		attrs = append(attrs, "limit", v.lim.name, "estimate", v.est, "threshold", v.theta)
	}
	if skipped > 0 {
		attrs = append(attrs, "log_lines_skipped", skipped)
	}
	m.log.Info("sketchproxy decision", attrs...)
}

// display is a key as logs and metrics show it: a client address in full,
// but a key with a header or query part (an API key, a token) as its first
// 6 bytes and a hash, so that /metrics and the logs leak no credential.
func (ru *rule) display(key string) string {
	if !ru.secretKey {
		return truncate(key, 128)
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return fmt.Sprintf("%s…%08x", truncate(key[:min(len(key), 6)], 6), h.Sum32())
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

const logsPerSecond = 20

// logLimiter lets logsPerSecond lines through each second.
type logLimiter struct {
	sec     atomic.Int64
	n       atomic.Int64
	skipped atomic.Int64
}

func (l *logLimiter) allow(now time.Time) (bool, int64) {
	s := now.Unix()
	if old := l.sec.Load(); old != s && l.sec.CompareAndSwap(old, s) {
		l.n.Store(0)
	}
	if l.n.Add(1) > logsPerSecond {
		l.skipped.Add(1)
		return false, 0
	}
	return true, l.skipped.Swap(0)
}

// spikeMeter counts first sightings per second and keeps a moving average
// of past seconds (about 30 s), with no goroutine: the first call in a new
// second rolls the window.
type spikeMeter struct {
	sec   atomic.Int64
	cur   atomic.Int64
	last  atomic.Int64  // the last whole second's count
	avg   atomic.Uint64 // float64 bits: the moving average before that
	total atomic.Uint64
}

const spikeAlpha = 1.0 / 30

// first records a first sighting.
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

// rate is the first sightings per second now: the larger of the last whole
// second and the current one so far.
func (s *spikeMeter) rate(now time.Time) float64 {
	s.roll(now)
	return float64(max(s.last.Load(), s.cur.Load()))
}

// active reports a spike: the rate above MinPerSecond and above SpikeFactor
// times the average of the seconds before.
func (s *spikeMeter) active(now time.Time, c *NewKeysConfig) bool {
	r := s.rate(now)
	return r > c.MinPerSecond && r > c.SpikeFactor*math.Float64frombits(s.avg.Load())
}
