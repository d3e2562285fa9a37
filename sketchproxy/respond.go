package sketchproxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

// setHeaders writes the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10 for every limit of every rule
// that decided the request (shadow rules send none): each policy's quota
// as whole requests q per whole seconds w, and for each its remaining r
// (never above q) and t, the seconds until more quota (the next halving).
// On a refusal RateLimit lists only the policies the client is over, each
// with its own wait as t, so that Retry-After (the longest wait) is never
// earlier than a t. Legacy X-RateLimit-* describe the most constrained
// limit, if configured.
func (m *Middleware) setHeaders(h http.Header, st *state, vs []verdict, rq *request, now time.Time, refused bool) {
	var cur []byte
	var pol string
	rules := 0
	var legacy struct {
		q, r, t int64
		level   float64
		set     bool
	}
	for i := range vs {
		v := &vs[i]
		if v.ru == nil || v.shadow || v.out == Allowlisted || len(v.ests) == 0 {
			continue
		}
		if rules++; rules == 1 {
			pol = v.ru.policy
		} else {
			pol += ", " + v.ru.policy
		}
		for j, l := range v.ru.limits {
			est := v.ests[j]
			if refused {
				rq.buf = skey(rq.buf, v.ru.cfg.Name, l.name, v.key)
				est = m.limitEstimate(rq.buf, l, now)
			} else if !v.banned {
				est += l.unit // this request, counted
			}
			theta := v.thetas[j]
			r := min((int64(theta)-int64(est))/int64(l.unit), l.q)
			t := seconds(untilNextTick(now, l.tick))
			over := uint64(est)+uint64(l.unit) > uint64(theta)
			if over {
				r = 0
				t = seconds(retryAfter(est, l.unit, theta, now, l.tick))
			}
			r = max(r, 0)
			if !refused || over {
				if cur == nil {
					cur = make([]byte, 0, 48*len(v.ru.limits))
				}
				cur = appendItem(cur, l.quoted, r, t)
			}
			if lv := float64(est) / float64(theta); !legacy.set || lv > legacy.level {
				legacy.q, legacy.r, legacy.t, legacy.level, legacy.set = l.q, r, t, lv, true
			}
		}
	}
	if rules == 0 {
		return
	}
	h[hdrPolicy] = []string{pol}
	if len(cur) > 0 {
		h[hdrRateLimit] = []string{string(cur)}
	}
	if st.cfg.Headers.Legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(legacy.q, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(legacy.r, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(legacy.t, 10))
	}
}

// appendItem appends one item of the RateLimit field to b, after a comma
// if b has items already: the policy's quoted name, its remaining quota r
// and the seconds t until more. The HTTP responses and Envoy's rate-limit
// service write the field through it.
func appendItem(b []byte, quoted string, r, t int64) []byte {
	if len(b) > 0 {
		b = append(b, ", "...)
	}
	b = append(b, quoted...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, r, 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, t, 10)
}

// The fields' canonical keys (http.CanonicalHeaderKey), set directly.
const (
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
)

// problem is an RFC 9457 problem details body.
type problem struct {
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Status     int      `json:"status"`
	Detail     string   `json:"detail"`
	Rule       string   `json:"rule,omitempty"`
	Limit      string   `json:"limit,omitempty"`
	Outcome    string   `json:"outcome,omitempty"`
	RetryAfter int64    `json:"retry_after,omitempty"`
	Level      float64  `json:"level,omitempty"` // estimate / threshold
	Violated   []string `json:"violated-policies,omitempty"`
}

// quotaExceeded is the draft's problem type for a client over its quota.
const quotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"

func (m *Middleware) problemFor(v *verdict, code int) problem {
	p := problem{
		Type: "about:blank", Title: http.StatusText(code), Status: code,
		Outcome: v.out.String(), RetryAfter: seconds(v.retry),
		Level: math.Round(v.level*100) / 100,
	}
	if v.ru == nil {
		p.Detail = "too many requests in progress from this client address; retry when one has finished"
		return p
	}
	p.Rule = v.ru.cfg.Name
	switch v.out {
	case OverBudget:
		b := v.ru.budget.cfg
		p.Type, p.Limit, p.Violated = quotaExceeded, b.Name, []string{v.ru.cfg.Name + "-" + b.Name}
		p.Detail = fmt.Sprintf("budget %q of %s units per %v is spent; retry after %d s", b.Name, formatNum(b.Units), time.Duration(b.Per), p.RetryAfter)
	case BudgetUnknown:
		p.Limit = v.ru.budget.cfg.Name
		p.Detail = fmt.Sprintf("budget %q cannot be tracked for this client right now, and the route fails closed; retry after %d s", p.Limit, p.RetryAfter)
	case InFlight:
		p.Detail = fmt.Sprintf("at most %d requests in flight per client on rule %q", v.ru.cfg.MaxInFlight, v.ru.cfg.Name)
	case TarpitFull:
		p.Detail = fmt.Sprintf("rule %q: over the limit; retry after %d s", v.ru.cfg.Name, p.RetryAfter)
	default:
		if v.lim != nil {
			p.Type, p.Limit, p.Violated = quotaExceeded, v.lim.name, []string{v.lim.policy}
			p.Detail = fmt.Sprintf("rule %q limit %q: %s requests per %v; retry after %d s", v.ru.cfg.Name, v.lim.name, formatNum(v.lim.requests), v.lim.per, p.RetryAfter)
		}
		if v.out == Ban {
			p.Detail = "temporarily banned: " + p.Detail
		}
	}
	return p
}

// refusal sets a refusal's headers and returns its problem+json body.
func (m *Middleware) refusal(h http.Header, st *state, v *verdict, vs []verdict, code int) []byte {
	rq := &request{}
	m.setHeaders(h, st, vs, rq, m.now(), true)
	h.Set("Retry-After", strconv.FormatInt(seconds(v.retry), 10))
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if v.out == Ban {
		h.Set("Connection", "close")
	}
	body, _ := json.Marshal(m.problemFor(v, code))
	body = append(body, '\n')
	h.Set("Content-Length", strconv.Itoa(len(body)))
	return body
}

// refuse writes a refusal at once.
func (m *Middleware) refuse(w http.ResponseWriter, st *state, v *verdict, vs []verdict, code int) {
	body := m.refusal(w.Header(), st, v, vs, code)
	w.WriteHeader(code)
	w.Write(body)
}

// badRequest refuses a request no rule can judge safely (an ambiguous path
// or key) with 400 and a problem saying what to fix.
func (m *Middleware) badRequest(w http.ResponseWriter, r *http.Request, why string) {
	m.met.badRequests.Add(1)
	if ok, skipped := m.logs.allow(m.now()); ok {
		attrs := []any{"why", why, "method", r.Method}
		if skipped > 0 {
			attrs = append(attrs, "log_lines_skipped", skipped)
		}
		m.log.Info("sketchproxy bad request", attrs...)
	}
	closeIfBody(w, r)
	writeProblem(w, http.StatusBadRequest, why+": send the request without it")
}

// writeProblem writes a small problem+json answer.
func writeProblem(w http.ResponseWriter, code int, detail string) {
	body, _ := json.Marshal(problem{Type: "about:blank", Title: http.StatusText(code), Status: code, Detail: detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}

// drip holds the client with a 429 written a byte at a time, without
// touching the upstream, for at most MaxDelay; with the tarpit at its caps it
// refuses at once.
func (m *Middleware) drip(w http.ResponseWriter, r *http.Request, st *state, v *verdict, vs []verdict) {
	if !m.hold(v.ru.cfg.Name, v.key, st) {
		v.out = TarpitFull
		v.ru.met.count(TarpitFull, false)
		m.refuse(w, st, v, vs, http.StatusTooManyRequests)
		return
	}
	defer m.release(v.ru.cfg.Name, v.key)
	t := &st.cfg.Tarpit
	body := m.refusal(w.Header(), st, v, vs, http.StatusTooManyRequests)
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

// logDecision logs a refusal (or a shadow one): the first of its rule's
// interval (refusallog.go), at most logsPerSecond a second in all; the
// next line says how many were left out.
func (m *Middleware) logDecision(r *http.Request, v *verdict, shadow bool) {
	rule := ""
	if v.ru != nil {
		rule = v.ru.cfg.Name
	}
	if !m.refusals.first(rule, shadow, m.opts.RefusalLogInterval, m.log) {
		return
	}
	ok, skipped := m.logs.allow(m.now())
	if !ok {
		return
	}
	attrs := []any{
		"rule", rule, "outcome", v.out.String(), "shadow", shadow,
		"key", m.display(v.key), "method", r.Method, "path", truncate(r.URL.Path, 256), // slog quotes and escapes control bytes
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

// initRedaction picks the key of the hash that stands for keys in logs and
// metrics: random, or from Options.Seed for repeatable tests.
func (m *Middleware) initRedaction() {
	if m.opts.Seed != 0 {
		binary.LittleEndian.PutUint64(m.redact[:], m.opts.Seed)
		m.redact = sha256.Sum256(m.redact[:8])
		return
	}
	rand.Read(m.redact[:])
}

// display is a key as logs and metrics show it: "k:" and the first 12 hex
// digits of its HMAC-SHA256 under a per-process key. A key is a client
// address, an API key or a token: none of them appears whole, and no byte a
// client chose reaches a log line or a label. The same key shows the same
// way for the life of the process, so one client's lines and series can be
// followed.
func (m *Middleware) display(key string) string {
	mac := hmac.New(sha256.New, m.redact[:])
	mac.Write([]byte(key))
	var sum [32]byte
	return "k:" + hex.EncodeToString(mac.Sum(sum[:0])[:6])
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
func (s *spikeMeter) active(now time.Time, c *NewKeysConfig) bool {
	r := s.rate(now)
	return r > c.MinPerSecond && r > c.SpikeFactor*math.Float64frombits(s.avg.Load())
}
