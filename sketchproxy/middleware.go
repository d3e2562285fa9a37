package sketchproxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch"
)

// Options are what a program supplies beside the Config.
type Options struct {
	// Clock drives the sketches and Retry-After (nil: the wall clock). Tests
	// and replays pass an epochsketch.ManualClock.
	Clock epochsketch.Clock
	// Logger receives decisions and reloads (nil: slog.Default()).
	Logger *slog.Logger
	// Seed makes the sketches' hashes and lotteries repeatable (0: random,
	// which is what production wants: a known seed helps attackers).
	Seed uint64
	// Sleep waits for d or until ctx ends (nil: a timer). Tests inject it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Middleware is SketchProxy as an http.Handler around any handler: it
// decides each request against its rules before next sees it. It is safe
// for concurrent use; Reload swaps the rules while requests run.
type Middleware struct {
	next  http.Handler
	opts  Options
	log   *slog.Logger
	state atomic.Pointer[state]

	held     atomic.Int64 // tarpitted requests held now
	heldKeys *countMin    // the same, per key
	spike    spikeMeter
	logs     logLimiter

	mu      sync.Mutex // guards ruleMet and sketch reuse across reloads
	ruleMet map[string]*ruleMetrics
	met     globalMetrics

	fleet *fleet // nil without Config.Fleet

	saverStop, saverDone chan struct{} // the state file's saver, if any
	closeOnce            sync.Once
	closeErr             error
}

// state is one configuration's compiled rules and the sketches they use.
type state struct {
	cfg      *Config
	rules    []*rule
	sketches map[sketchKey]*epochsketch.Sketch
	newKeys  *epochsketch.Sketch // keys first seen during a spike
	bans     *epochsketch.Sketch // temporary bans
	banTick  time.Duration
	gen      int64
}

type sketchKey struct {
	tick    time.Duration
	buckets int
	two     bool
}

type rule struct {
	cfg      *Rule
	methods  map[string]bool
	limits   []*limit
	budget   *budgetState
	inflight *countMin
	top      *epochsketch.TopK
	met      *ruleMetrics
	policy   string // RateLimit-Policy value
	needIP   bool
	// secretKey: the key has a header or query part, shown redacted.
	secretKey bool
}

type limit struct {
	name     string
	policy   string // the RateLimit policy's name: rule-limit
	sk       *epochsketch.Sketch
	tick     time.Duration
	theta    uint32
	requests float64
	per      time.Duration
}

type budgetState struct {
	cfg   *Budget
	sk    *epochsketch.Sketch
	tick  time.Duration
	theta uint32
}

// New compiles cfg (which must have passed Validate, as LoadConfig's does)
// into a Middleware in front of next.
func New(cfg *Config, next http.Handler, opts Options) (*Middleware, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Sleep == nil {
		opts.Sleep = sleepCtx
	}
	m := &Middleware{
		next:     next,
		opts:     opts,
		log:      opts.Logger,
		heldKeys: newCountMin(),
		ruleMet:  map[string]*ruleMetrics{},
	}
	if err := m.Reload(cfg); err != nil {
		return nil, err
	}
	if cfg.StateFile != "" {
		m.loadState()
		m.saverStop, m.saverDone = make(chan struct{}), make(chan struct{})
		go m.saver(time.Duration(cfg.StateEvery))
	}
	if cfg.Fleet != nil {
		m.fleet = newFleet(cfg.Fleet, m.log, m.now)
	}
	return m, nil
}

// saver writes the state file every interval until Close.
func (m *Middleware) saver(every time.Duration) {
	defer close(m.saverDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.saverStop:
			return
		case <-t.C:
			if err := m.SaveState(); err != nil {
				m.log.Error("state save failed", "err", err.Error())
			}
		}
	}
}

// Reload switches to cfg. Sketches whose tick and size are unchanged are
// kept, with their counts; the others start empty. If cfg is invalid the
// current configuration stays and the error says why.
func (m *Middleware) Reload(cfg *Config) error {
	if err := cfg.Validate(); err != nil {
		m.met.reloads[1].Add(1)
		return err
	}
	if old := m.state.Load(); old != nil && (old.cfg.Fleet == nil) != (cfg.Fleet == nil) {
		m.met.reloads[1].Add(1)
		return &ConfigError{File: cfg.src, Field: "fleet", Msg: "adding or removing the fleet takes a restart"}
	} else if old != nil && cfg.Fleet != nil && m.fleet != nil {
		cfg.Fleet = m.fleet.cfg // fleet settings take a restart; the rules reload
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.state.Load()
	st := &state{cfg: cfg, sketches: map[sketchKey]*epochsketch.Sketch{}}
	if old != nil {
		st.gen = old.gen + 1
	}
	sketch := func(tick time.Duration, buckets int) *epochsketch.Sketch {
		k := sketchKey{tick, buckets, cfg.Sketch.TwoChoice}
		if s, ok := st.sketches[k]; ok {
			return s
		}
		if old != nil {
			if s, ok := old.sketches[k]; ok {
				st.sketches[k] = s
				return s
			}
		}
		s := epochsketch.New(epochsketch.Config{
			NumBuckets: buckets, TickDuration: tick, Clock: m.opts.Clock,
			Seed: m.opts.Seed, TwoChoice: cfg.Sketch.TwoChoice,
			// Keys are chosen by clients: a keyed hash (THEORY.md section
			// 6), whose key a state file can keep.
			Hash: epochsketch.HashSipHash13,
		})
		st.sketches[k] = s
		return s
	}
	for _, rc := range cfg.Rules {
		rc := rc
		ru := &rule{cfg: &rc, top: epochsketch.NewTopK(10)}
		if len(rc.Match.Methods) > 0 {
			ru.methods = map[string]bool{}
			for _, mt := range rc.Match.Methods {
				ru.methods[mt] = true
			}
		}
		for _, k := range rc.Key {
			ru.needIP = ru.needIP || k == "ip"
			ru.secretKey = ru.secretKey || k != "ip"
		}
		ru.needIP = ru.needIP || len(rc.Allow.prefixes) > 0
		var pol []string
		for i := range rc.Limits {
			l := &rc.Limits[i]
			tick := tickFor(l.Requests, time.Duration(l.Per), l.Burst)
			lim := &limit{
				name: l.Name, policy: rc.Name + "-" + l.Name, tick: tick,
				theta: thresholdFor(l.Burst), requests: l.Requests, per: time.Duration(l.Per),
				sk: sketch(tick, cfg.Sketch.Buckets),
			}
			ru.limits = append(ru.limits, lim)
			pol = append(pol, fmt.Sprintf("%q;q=%s;w=%d", lim.policy, formatNum(l.Requests), int64(max(time.Second, lim.per)/time.Second)))
		}
		ru.policy = strings.Join(pol, ", ")
		if b := rc.Budget; b != nil {
			tick := tickFor(b.Units, time.Duration(b.Per), b.Units)
			ru.budget = &budgetState{cfg: b, tick: tick, theta: thresholdFor(b.Units), sk: sketch(tick, cfg.Sketch.Buckets)}
		}
		var prev *rule // the same rule in the running config
		if old != nil {
			for _, o := range old.rules {
				if o.cfg.Name == rc.Name {
					prev = o
				}
			}
		}
		if prev != nil {
			ru.top = prev.top
		}
		if rc.MaxInFlight > 0 {
			ru.inflight = newCountMin()
			if prev != nil && prev.inflight != nil {
				ru.inflight = prev.inflight // requests in flight stay counted
			}
		}
		if m.ruleMet[rc.Name] == nil {
			m.ruleMet[rc.Name] = &ruleMetrics{}
		}
		ru.met = m.ruleMet[rc.Name]
		st.rules = append(st.rules, ru)
	}
	// Small side sketches: new keys during a spike, and bans.
	st.newKeys = sketch(time.Duration(cfg.NewKeys.Window), 1<<12)
	st.banTick = max(time.Millisecond, time.Duration(cfg.Tarpit.BanFor)/4)
	st.bans = sketch(st.banTick, 1<<12)
	m.state.Store(st)
	if old != nil {
		for k, s := range old.sketches {
			if st.sketches[k] != s {
				s.Close()
			}
		}
	}
	m.met.reloads[0].Add(1)
	return nil
}

// ReloadFrom calls load and reloads with its config; a failure of either is
// counted in sketchproxy_config_reloads_total{result="invalid"} and leaves
// the running config.
func (m *Middleware) ReloadFrom(load func() (*Config, error)) error {
	cfg, err := load()
	if err != nil {
		m.met.reloads[1].Add(1)
		return err
	}
	return m.Reload(cfg)
}

// Close saves the state file, if configured, and stops the sketches'
// clocks and the fleet's sync. Call it at shutdown, after the server has
// stopped taking requests.
func (m *Middleware) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.close() })
	return m.closeErr
}

func (m *Middleware) close() error {
	var err error
	if m.saverStop != nil {
		close(m.saverStop)
		<-m.saverDone
		m.saverStop = nil
		if err = m.SaveState(); err != nil {
			m.log.Error("state save at shutdown failed", "err", err.Error())
		}
	}
	if m.fleet != nil {
		m.fleet.close()
	}
	if st := m.state.Load(); st != nil {
		for _, s := range st.sketches {
			s.Close()
		}
	}
	return err
}

func (m *Middleware) now() time.Time {
	if m.opts.Clock != nil {
		return m.opts.Clock.Now()
	}
	return time.Now()
}

// Outcome is what happened to a request under one rule.
type Outcome uint8

// The outcomes, least severe first.
const (
	Allow         Outcome = iota
	Allowlisted           // the rule's allow list: no sketch work
	Delay                 // held, then proxied
	Drip                  // a 429 dripped slowly; never proxied
	TarpitFull            // over the limit with the tarpit at its caps: an immediate 429
	InFlight              // the key has max_in_flight requests running: 429
	BudgetUnknown         // the wallet cannot be tracked: 503 (fail closed)
	OverBudget            // the wallet is spent: 429
	Reject                // over the limit: 429
	Ban                   // far over the limit: 429 and Connection: close until the ban ends
	numOutcomes
)

var outcomeNames = [...]string{"allow", "allowlisted", "delay", "drip", "tarpit_full", "in_flight", "budget_unknown", "over_budget", "reject", "ban"}

func (o Outcome) String() string { return outcomeNames[o] }

// verdict is a rule's decision with what the headers need.
type verdict struct {
	out   Outcome
	level float64 // estimate / threshold of the most constrained limit
	ru    *rule
	lim   *limit
	est   uint32
	theta uint32
	retry time.Duration
	delay time.Duration
	key   string
}

func (v *verdict) worse(o *verdict) bool {
	if o.out != v.out {
		return o.out > v.out && o.out != Allowlisted
	}
	return o.level > v.level
}

// request holds what one request needs across rules.
type request struct {
	r     *http.Request
	addr  netip.Addr
	ip    string
	query url.Values
	buf   []byte
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

func (rq *request) part(ci *ClientIPConfig, k string) string {
	switch {
	case k == "ip":
		if rq.ip == "" {
			rq.ip = ci.group(rq.addr)
		}
		return rq.ip
	case strings.HasPrefix(k, "header:"):
		if v := rq.r.Header.Get(k[len("header:"):]); v != "" {
			return v
		}
	case strings.HasPrefix(k, "query:"):
		if rq.query == nil {
			rq.query = rq.r.URL.Query()
		}
		if v := rq.query.Get(k[len("query:"):]); v != "" {
			return v
		}
	}
	return "-"
}

func (ru *rule) matches(r *http.Request) bool {
	mt := ru.cfg.Match
	if mt.Host != "" {
		h := r.Host
		if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
			h = h[:i]
		}
		if !strings.EqualFold(strings.Trim(h, "[]"), mt.Host) {
			return false
		}
	}
	if mt.PathPrefix != "" && !strings.HasPrefix(r.URL.Path, mt.PathPrefix) {
		return false
	}
	return ru.methods == nil || ru.methods[r.Method]
}

func (ru *rule) key(ci *ClientIPConfig, rq *request) string {
	if len(ru.cfg.Key) == 1 {
		return rq.part(ci, ru.cfg.Key[0])
	}
	var b strings.Builder
	for i, k := range ru.cfg.Key {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(rq.part(ci, k))
	}
	return b.String()
}

func (ru *rule) allowlisted(addr netip.Addr, key string) bool {
	for _, p := range ru.cfg.Allow.prefixes {
		if addr.IsValid() && p.Contains(addr) {
			return true
		}
	}
	return ru.cfg.Allow.keys[key]
}

// skey builds "rule\x00limit\x00key" in buf.
func skey(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0)
	buf = append(buf, b...)
	buf = append(buf, 0)
	return append(buf, key...)
}

// evaluate runs one rule's limits for key at now.
func (m *Middleware) evaluate(st *state, ru *rule, rq *request, key string, now time.Time) verdict {
	v := verdict{ru: ru, key: key}
	cfg := st.cfg
	rq.buf = skey(rq.buf, ru.cfg.Name, "", key)
	if len(ru.limits) > 0 {
		if ban := st.bans.EstimateBytes(rq.buf); ban > 0 {
			v.out, v.level = Ban, cfg.Tarpit.BanAbove
			v.retry = retryAfter(ban, 1, 1, now, st.banTick)
			v.lim = ru.limits[0]
			v.theta = v.lim.theta
			return v
		}
	}
	newKey := false
	if !cfg.NewKeys.Disabled && len(ru.limits) > 0 {
		newKey = st.newKeys.EstimateBytes(rq.buf) > 0
	}
	for i, l := range ru.limits {
		rq.buf = skey(rq.buf, ru.cfg.Name, l.name, key)
		est, first := l.sk.ObserveBytes(rq.buf)
		firstSighting := i == 0 && first && est == 1
		if m.fleet != nil {
			est = m.fleet.estimate(rq.buf, l.sk, l.tick, l.theta, est, 1, now)
		}
		if firstSighting {
			// A first sighting: count it, and during a spike remember the
			// key as new.
			m.spike.first(now)
			if !cfg.NewKeys.Disabled && m.spike.active(now, &cfg.NewKeys) {
				st.newKeys.ObserveBytes(skey(nil, ru.cfg.Name, "", key))
				newKey = true
			}
		}
		theta := l.theta
		if newKey {
			theta = max(1, uint32(float64(theta)*cfg.NewKeys.BudgetFactor))
		}
		lv := float64(est) / float64(theta)
		if lv > v.level || v.lim == nil {
			v.level, v.lim, v.est, v.theta = lv, l, est, theta
		}
	}
	if v.lim == nil || v.level <= 1 {
		v.out = Allow
		if v.lim != nil {
			v.retry = untilNextTick(now, v.lim.tick)
		}
		return v
	}
	v.retry = retryAfter(v.est, 1, v.theta, now, v.lim.tick)
	t := &cfg.Tarpit
	if !ru.cfg.Tarpit {
		v.out = Reject
		return v
	}
	switch {
	case v.level > t.BanAbove:
		v.out = Ban
		rq.buf = skey(rq.buf, ru.cfg.Name, "", key)
		st.bans.ObserveBytesN(rq.buf, 16) // 16 >> 4 ticks of BanFor/4: about BanFor
		v.retry = max(v.retry, time.Duration(t.BanFor))
	case v.level > t.RejectAbove:
		v.out = Reject
	case v.level > t.DripAbove:
		v.out = Drip
	case v.level > t.DelayAbove:
		v.out = Delay
		span := max(t.DripAbove-t.DelayAbove, 1e-9)
		v.delay = time.Duration(float64(t.MaxDelay) * min(1, (v.level-t.DelayAbove)/span))
		v.delay = max(v.delay, 50*time.Millisecond)
	default:
		v.out = Allow // exactly at the ladder's first step
	}
	return v
}

// ServeHTTP decides and then proxies, holds, or refuses the request.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	st := m.state.Load()
	now := m.now()
	m.met.requests.Add(1)
	rq := &request{r: r}
	bp := bufPool.Get().(*[]byte)
	rq.buf = (*bp)[:0]
	defer func() { *bp = rq.buf[:0]; bufPool.Put(bp) }()

	var matched []*rule
	var keys []string
	for _, ru := range st.rules {
		if ru.matches(r) {
			if ru.needIP && !rq.addr.IsValid() {
				rq.addr = st.cfg.ClientIP.clientAddr(r)
			}
			matched = append(matched, ru)
		}
	}
	worst := verdict{out: Allow}
	var hdr *verdict // the limit the RateLimit headers describe
	keys = make([]string, len(matched))
	verdicts := make([]verdict, len(matched))
	for i, ru := range matched {
		key := ru.key(&st.cfg.ClientIP, rq)
		keys[i] = key
		if ru.allowlisted(rq.addr, key) {
			ru.met.count(Allowlisted, false)
			verdicts[i] = verdict{out: Allowlisted, ru: ru}
			continue
		}
		v := m.evaluate(st, ru, rq, key, now)
		if v.est > 0 && v.level > 0.5 {
			ru.top.Offer(key, v.est)
		}
		if v.out != Allow && ru.cfg.Shadow {
			ru.met.count(v.out, true)
			m.logDecision(r, &v, true)
			v = verdict{out: Allow, ru: ru, lim: v.lim, est: v.est, theta: v.theta, level: v.level, retry: v.retry}
		}
		verdicts[i] = v
		if v.lim != nil && (hdr == nil || v.level > hdr.level) {
			hdr = &verdicts[i]
		}
		if worst.worse(&v) {
			worst = v
		}
	}
	switch worst.out {
	case Reject, Ban:
		worst.ru.met.count(worst.out, false)
		m.logDecision(r, &worst, false)
		m.refuse(w, st, &worst, http.StatusTooManyRequests)
		return
	case Drip:
		worst.ru.met.count(Drip, false)
		m.logDecision(r, &worst, false)
		m.drip(w, r, st, &worst)
		return
	case Delay:
		if !m.hold(worst.ru.cfg.Name, worst.key, st) {
			worst.out = TarpitFull
			worst.ru.met.count(TarpitFull, false)
			m.refuse(w, st, &worst, http.StatusTooManyRequests)
			return
		}
		worst.ru.met.count(Delay, false)
		err := m.opts.Sleep(r.Context(), worst.delay)
		m.release(worst.ru.cfg.Name, worst.key)
		if err != nil {
			return // the client went away while held
		}
	}

	// Everyone allows: wallets and in-flight caps, then the upstream.
	var charged, inflight []charge
	undo := func() {
		for _, c := range inflight {
			c.ru.inflight.add(c.ru.cfg.Name, c.key, -1)
		}
	}
	for i, ru := range matched {
		if verdicts[i].out == Allowlisted {
			continue
		}
		if b := ru.budget; b != nil {
			v, ok := m.chargeBudget(ru, rq, keys[i], now)
			if !ok {
				undo()
				ru.met.count(v.out, false)
				m.logDecision(r, &v, false)
				code := http.StatusTooManyRequests
				if v.out == BudgetUnknown {
					code = http.StatusServiceUnavailable
				}
				m.refuse(w, st, &v, code)
				return
			}
			charged = append(charged, charge{ru: ru, key: keys[i]})
		}
		if ru.inflight != nil {
			if !ru.inflight.acquire(ru.cfg.Name, keys[i], ru.cfg.MaxInFlight) {
				undo()
				v := verdict{out: InFlight, ru: ru, key: keys[i], retry: time.Second}
				ru.met.count(InFlight, false)
				m.logDecision(r, &v, false)
				m.refuse(w, st, &v, http.StatusTooManyRequests)
				return
			}
			inflight = append(inflight, charge{ru: ru, key: keys[i]})
		}
	}
	for i, ru := range matched {
		if verdicts[i].out == Allow && worst.out != Delay {
			ru.met.count(Allow, false)
		}
	}
	if hdr != nil && !st.cfg.Headers.Off {
		m.setHeaders(w.Header(), st, hdr)
	}
	defer undo()
	m.met.inFlight.Add(1)
	defer m.met.inFlight.Add(-1)
	if len(charged) > 0 {
		w = &reconcileWriter{ResponseWriter: w, m: m, charged: charged, now: now}
	}
	m.next.ServeHTTP(w, r)
}

// charge is a rule and the key a request was counted under in it.
type charge struct {
	ru  *rule
	key string
}

// chargeBudget charges the rule's cost to key, unless the wallet is spent
// (OverBudget) or cannot be tracked (BudgetUnknown, unless FailOpen).
func (m *Middleware) chargeBudget(ru *rule, rq *request, key string, now time.Time) (verdict, bool) {
	b := ru.budget
	rq.buf = skey(rq.buf, ru.cfg.Name, "$"+b.cfg.Name, key)
	est := b.sk.EstimateBytes(rq.buf)
	if f := m.fleet; f != nil {
		if !f.up.Load() && f.cfg.WalletOnFailure == "closed" {
			return verdict{out: BudgetUnknown, ru: ru, key: key, retry: time.Duration(f.cfg.Interval)}, false
		}
		est = f.estimate(rq.buf, b.sk, b.tick, b.theta, est, 0, now)
	}
	if uint64(est)+uint64(b.cfg.Cost) > uint64(b.theta) {
		return verdict{out: OverBudget, ru: ru, key: key, est: est, theta: b.theta,
			level: float64(est) / float64(b.theta),
			retry: retryAfter(est, b.cfg.Cost, b.theta, now, b.tick)}, false
	}
	b.sk.ObserveBytesN(rq.buf, b.cfg.Cost)
	if m.fleet != nil {
		m.fleet.add(rq.buf, b.cfg.Cost)
	}
	if b.sk.EstimateBytes(rq.buf) == 0 && !b.cfg.FailOpen {
		// The lottery did not admit the key: its spend is not tracked.
		return verdict{out: BudgetUnknown, ru: ru, key: key, retry: untilNextTick(now, b.tick)}, false
	}
	return verdict{}, true
}

// reconcileWriter charges what the upstream says a request used, from the
// budget's header, when the response starts.
type reconcileWriter struct {
	http.ResponseWriter
	m       *Middleware
	charged []charge
	now     time.Time
	done    bool
}

func (rw *reconcileWriter) WriteHeader(code int) {
	if !rw.done && code >= 200 {
		rw.done = true
		for _, c := range rw.charged {
			b := c.ru.budget
			h := b.cfg.ReconcileHeader
			if h == "" {
				continue
			}
			v := rw.ResponseWriter.Header().Get(h)
			if v == "" {
				continue
			}
			used, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			if err != nil {
				rw.m.met.reconcileErrors.Add(1)
				continue
			}
			if extra := uint32(used); extra > b.cfg.Cost {
				buf := skey(nil, c.ru.cfg.Name, "$"+b.cfg.Name, c.key)
				b.sk.ObserveBytesN(buf, extra-b.cfg.Cost)
				if rw.m.fleet != nil {
					rw.m.fleet.add(buf, extra-b.cfg.Cost)
				}
				rw.m.met.reconciled.Add(uint64(extra - b.cfg.Cost))
			}
		}
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *reconcileWriter) Write(p []byte) (int, error) {
	if !rw.done {
		rw.WriteHeader(http.StatusOK)
	}
	return rw.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach Flush and Hijack (SSE,
// WebSocket).
func (rw *reconcileWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// hold takes a tarpit place for key, or reports the caps full.
func (m *Middleware) hold(rule, key string, st *state) bool {
	t := &st.cfg.Tarpit
	if m.held.Add(1) > int64(t.MaxHeld) {
		m.held.Add(-1)
		return false
	}
	if !m.heldKeys.acquire(rule, key, t.MaxHeldPerKey) {
		m.held.Add(-1)
		return false
	}
	return true
}

func (m *Middleware) release(rule, key string) {
	m.heldKeys.add(rule, key, -1)
	m.held.Add(-1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// countMin counts per key in fixed memory: two rows of counters, a key's
// count is the smaller of its two (never below the truth, rarely above).
type countMin struct {
	seed maphash.Seed
	rows [2][1 << 12]atomic.Int32
}

func newCountMin() *countMin { return &countMin{seed: maphash.MakeSeed()} }

func (c *countMin) idx(rule, key string) (int, int) {
	var h maphash.Hash
	h.SetSeed(c.seed)
	h.WriteString(rule)
	h.WriteByte(0)
	h.WriteString(key)
	x := h.Sum64()
	return int(x & (1<<12 - 1)), int(x >> 52)
}

func (c *countMin) add(rule, key string, d int32) int32 {
	i, j := c.idx(rule, key)
	return min(c.rows[0][i].Add(d), c.rows[1][j].Add(d))
}

// acquire adds one unless the key already has limit.
func (c *countMin) acquire(rule, key string, limit int) bool {
	if n := c.add(rule, key, 1); n > int32(limit) {
		c.add(rule, key, -1)
		return false
	}
	return true
}

func formatNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }
