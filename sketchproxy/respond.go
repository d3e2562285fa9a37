package sketchproxy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

// The door's answers: every refusal goes out through refuse, with its
// problem body, its RateLimit fields and its log line (by rule, at most
// logsPerSecond lines a second); an admitted request gets its fields from
// setHeaders.

// refusal is an answer the door gives in the upstream's place: with a
// decision, a rule's refusal (or the per-client cap's); without one, a
// request the door will not judge. refuse writes every one of them.
type refusal struct {
	code int    // the status sent
	why  string // the problem's detail, for an answer without a decision
	// header and value are one header the answer carries besides its own:
	// 405's Allow, 401's WWW-Authenticate.
	header, value string
}

// refuse answers r with rf, in place of the upstream: every refusal and
// every bad request of the HTTP doors goes out here. It counts and logs
// the answer (account), then writes its problem+json body (RFC 9457). A
// rule's refusal (d, nil for the others) also carries its RateLimit
// fields and Retry-After, and is dripped where the tarpit holds it. d is
// apart from rf so that it stays on the caller's stack: the words of rf
// reach the log.
func (m *Middleware) refuse(w http.ResponseWriter, r *http.Request, st *state, d *engine.Decision, rf refusal) {
	m.account(w, r, d, rf)
	h := w.Header()
	if rf.header != "" {
		h.Set(rf.header, rf.value)
	}
	p := problem{Type: "about:blank", Title: http.StatusText(rf.code), Status: rf.code, Detail: rf.why}
	if rf.code == http.StatusBadRequest {
		p.Detail += ": send the request without it" // what to fix
	}
	if d != nil {
		m.setHeaders(h, st, &d.Fields)
		h.Set("Retry-After", strconv.FormatInt(rate.Seconds(d.Retry), 10))
		if d.Close() {
			h.Set("Connection", "close")
		}
		p = m.problemFor(&d.Worst, d.Retry, rf.code)
	}
	body, _ := json.Marshal(p)
	body = append(body, '\n')
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(rf.code)
	if d != nil && d.Drip {
		m.drip(w, r, st, body)
		return
	}
	w.Write(body)
}

// account counts and logs a refusal, and closes the connection after one
// whose body it leaves unread (closeIfBody) where a slow body could hold
// the answer back: a rule's refusal (and the per-client cap's) is logged
// by rule (logDecision); a bad request (400) by its reason, at most
// logsPerSecond lines a second.
func (m *Middleware) account(w http.ResponseWriter, r *http.Request, d *engine.Decision, rf refusal) {
	switch code := rf.code; {
	case d != nil:
		closeIfBody(w, r)
		if d.Worst.Rule == nil {
			m.met.clientCap.Add(1) // server.max_in_flight_per_client
		}
		m.logDecision(r, &d.Worst, false, d.Never)
	case code == http.StatusBadRequest:
		m.met.badRequests.Add(1)
		if ok, skipped := m.logs.Allow(m.now(), logsPerSecond); ok {
			attrs := []any{"why", rf.why, "method", r.Method}
			if skipped > 0 {
				attrs = append(attrs, "log_lines_skipped", skipped)
			}
			m.log.Info("sketchproxy bad request", attrs...)
		}
		closeIfBody(w, r)
	case code == http.StatusForbidden || code == http.StatusMethodNotAllowed:
		m.met.badRequests.Add(1) // a forward-auth caller not trusted; CONNECT, TRACE
	case code == http.StatusUnauthorized:
		m.met.unauthorized.Add(1)
		closeIfBody(w, r)
	case code == http.StatusRequestTimeout:
		m.met.bodyTimeouts.Add(1)
		closeIfBody(w, r)
	}
}

// closeIfBody closes the connection after a refusal of an HTTP/1 request
// whose body was not read: the server would otherwise read (and wait for)
// the whole body before it sends the answer, which a slow client drips for
// as long as it likes. HTTP/2 ends the one stream instead when the handler
// returns; there Go's server turns Connection: close into a GOAWAY, and
// every other request on the connection (other clients' too, behind a
// gateway) would have to find a new one.
func closeIfBody(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// refusalCode is the status a refusal of d is sent with: 429, or 503 where
// the refusal is not the client's doing (a wallet that cannot be tracked);
// a forward-auth check's refusal_status instead where a gateway needs its
// own (nginx's 401 or 403). With the default 429 the check answers as the
// proxy does.
func (rq *request) refusalCode(d *engine.Decision) int {
	if rq.refusal != 0 && rq.refusal != http.StatusTooManyRequests {
		return rq.refusal
	}
	if d.Unavailable() {
		return http.StatusServiceUnavailable
	}
	return http.StatusTooManyRequests
}

// drip sends a refusal's body a byte at a time, without touching the
// upstream, for at most MaxDelay (the engine holds its tarpit place until
// the decision is Done), then the rest at once.
func (m *Middleware) drip(w http.ResponseWriter, r *http.Request, st *state, body []byte) {
	t := &st.cfg.Tarpit
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

func (m *Middleware) problemFor(v *verdict, retry time.Duration, code int) problem {
	p := problem{
		Type: "about:blank", Title: http.StatusText(code), Status: code,
		Outcome: v.Out.String(), RetryAfter: rate.Seconds(retry),
		Level: math.Round(v.Level*100) / 100,
	}
	ru := v.Rule
	if ru == nil {
		p.Detail = "too many requests in progress from this client address; retry when one has finished"
		return p
	}
	p.Rule = ru.Name
	switch v.Out {
	case engine.OverBudget:
		b := &ru.Budget.Spec
		p.Type, p.Limit, p.Violated = quotaExceeded, b.Name, []string{ru.Name + "-" + b.Name}
		p.Detail = fmt.Sprintf("budget %q of %s units per %v is spent; retry after %d s", b.Name, formatNum(b.Units), b.Per, p.RetryAfter)
	case engine.BudgetUnknown:
		p.Limit = ru.Budget.Spec.Name
		p.Detail = fmt.Sprintf("budget %q cannot be tracked for this client right now, and the route fails closed; retry after %d s", p.Limit, p.RetryAfter)
	case engine.InFlight:
		p.Detail = fmt.Sprintf("at most %d requests in flight per client on rule %q", ru.MaxInFlight, ru.Name)
	case engine.TarpitFull:
		p.Detail = fmt.Sprintf("rule %q: over the limit; retry after %d s", ru.Name, p.RetryAfter)
	default:
		if l := v.Limit; l != nil {
			p.Type, p.Limit, p.Violated = quotaExceeded, l.Name, []string{l.Policy}
			p.Detail = fmt.Sprintf("rule %q limit %q: %s requests per %v; retry after %d s", ru.Name, l.Name, formatNum(l.Requests), l.Per, p.RetryAfter)
		}
		if v.Out == engine.Ban {
			p.Detail = "temporarily banned: " + p.Detail
		}
	}
	return p
}

func formatNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// setHeaders writes the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10 (engine.Fields says what they
// hold), and the legacy X-RateLimit-* if configured.
func (m *Middleware) setHeaders(h http.Header, st *state, f *engine.Fields) {
	if !f.Any {
		return
	}
	h[hdrPolicy] = []string{f.Policy}
	if len(f.RateLimit) > 0 {
		h[hdrRateLimit] = []string{string(f.RateLimit)}
	}
	if st.cfg.Headers.Legacy {
		h.Set("X-RateLimit-Limit", strconv.FormatInt(f.LegacyLimit, 10))
		h.Set("X-RateLimit-Remaining", strconv.FormatInt(f.LegacyRemaining, 10))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(f.LegacyReset, 10))
	}
}

// The fields' canonical keys (http.CanonicalHeaderKey), set directly.
const (
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
)

// logDecision logs an HTTP door's refusal (or a shadow one), with the
// request's method and path, the key shown by its keyed hash (display).
func (m *Middleware) logDecision(r *http.Request, v *verdict, shadow, never bool) {
	if skipped, ok := m.mayLog(v, shadow); ok {
		m.logLine(v, shadow, never, m.display(v.Key), skipped, "method", r.Method, "path", truncate(r.URL.Path, 256)) // slog quotes and escapes control bytes
	}
}

// display is a key as this Middleware's logs and metrics show it. The same
// key shows the same way for the life of the process, so one client's lines
// and series can be followed; with key_label_secret_file, across restarts
// and replicas too.
func (m *Middleware) display(key string) string { return engine.Label(m.redact, key) }

// keyLabelOf is the label logs and metrics show for a verdict's key: an
// Envoy descriptor's values as sent (rls.KeyValues), an HTTP rule's key,
// under the keyed hash, so that sketchproxy -key-label computes both.
func (m *Middleware) keyLabelOf(v *verdict) string {
	if v.Rule != nil && rls.IsRule(v.Rule.Name) {
		return m.display(rls.KeyValues(v.Key))
	}
	return m.display(v.Key)
}

// logVerdict logs a refusal (or a shadow one) of any door, with the door's
// own attributes, the key shown by keyLabelOf (which knows Envoy's
// descriptors).
func (m *Middleware) logVerdict(v *verdict, shadow, never bool, door ...any) {
	if skipped, ok := m.mayLog(v, shadow); ok {
		m.logLine(v, shadow, never, m.keyLabelOf(v), skipped, door...)
	}
}

// mayLog reports whether a refusal (or a shadow one) is logged: the first
// of its rule's interval (refusalLog), at most logsPerSecond a second in
// all; skipped is how many lines the rate left out before it.
func (m *Middleware) mayLog(v *verdict, shadow bool) (skipped int64, ok bool) {
	rule := ""
	if v.Rule != nil {
		rule = v.Rule.Name
	}
	if !m.refusals.first(rule, shadow, m.opts.RefusalLogInterval, m.log) {
		return 0, false
	}
	ok, skipped = m.logs.Allow(m.now(), logsPerSecond)
	return skipped, ok
}

// logLine writes a refusal's line, its key shown as label; the line says
// how many were left out before it. Counts are in requests. retry_after_s
// is v.Retry in seconds, or "never" where no wait is enough (never: the
// request's Decision.Never for a refusal, the verdict's own Never for a
// shadow one).
func (m *Middleware) logLine(v *verdict, shadow, never bool, label string, skipped int64, door ...any) {
	rule := ""
	if v.Rule != nil {
		rule = v.Rule.Name
	}
	attrs := append([]any{"rule", rule, "outcome", v.Out.String(), "shadow", shadow, "key", label}, door...)
	if never {
		attrs = append(attrs, "retry_after_s", "never")
	} else {
		attrs = append(attrs, "retry_after_s", rate.Seconds(v.Retry))
	}
	if v.Limit != nil {
		attrs = append(attrs, "limit", v.Limit.Name, "estimate", v.Est/rate.Unit, "threshold", v.Theta/rate.Unit)
	}
	if skipped > 0 {
		attrs = append(attrs, "log_lines_skipped", skipped)
	}
	m.log.Info("sketchproxy decision", attrs...)
}

const logsPerSecond = 20

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

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
