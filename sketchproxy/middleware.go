package sketchproxy

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/bits"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

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
	// RefusalLogInterval is how often each rule's refusals are logged:
	// the first of an interval whole, the rest counted on one line at its
	// end (0: DefaultRefusalLogInterval; refusallog.go).
	RefusalLogInterval time.Duration
}

// Middleware is SketchProxy as an http.Handler around any handler: it
// decides each request against its rules before next sees it. It is safe
// for concurrent use; Reload swaps the rules while requests run.
type Middleware struct {
	next  http.Handler
	opts  Options
	log   *slog.Logger
	state atomic.Pointer[state]
	// startCheck is the forward-auth check the proxy's listener answered at
	// the start, if any: its path stays the check's there (checkHere).
	startCheck *ForwardAuthConfig

	held     atomic.Int64 // tarpitted requests held now
	heldKeys *countMin    // the same, per key
	wallets  walletLocks  // a wallet's check and its charge, as one step per key
	clients  *countMin    // requests in progress per client address
	spike    spikeMeter
	logs     logLimiter
	refusals refusalLog // the decision log, aggregated by rule
	billLogs logLimiter // reconcile errors: a flood of refusals never hides them
	redact   [32]byte   // the key of the hash that stands for keys in logs and metrics

	started       time.Time    // for new_keys.warmup
	restoredMeter atomic.Bool  // the state file restored the new-key meter
	lastNew       atomic.Int64 // when a key was last marked new (Unix ns; 0: never)
	lastBan       atomic.Int64 // when a key was last banned (Unix ns; 0: never)
	transport     atomic.Bool  // Transport is in use: wallet requests outlive their clients

	mu      sync.Mutex // guards ruleMet and sketch reuse across reloads
	ruleMet map[string]*ruleMetrics
	met     globalMetrics
	reg     *prometheus.Registry
	latency *prometheus.HistogramVec

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
	rls      map[string]*rlsNode // Envoy rate-limit domains (envoy_rls)
	rlsRules []*rule             // their descriptors' limits
	newKeys  *epochsketch.Sketch // keys first seen during a spike
	known    *epochsketch.Sketch // keys seen within about new_keys.remember
	jwt      *jwtVerifier        // nil without a jwt section
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
	// keyHeaders and keyQueries are the key's header:NAME (canonical) and
	// query:NAME parts, checked for ambiguity.
	keyHeaders, keyQueries []string
	needJWT                bool   // a key part is a claim of the bearer token
	policy                 string // the rule's RateLimit-Policy items
}

type limit struct {
	name     string
	policy   string // the RateLimit policy's name: rule-limit
	q, w     int64  // the policy as whole requests q per w seconds
	item     string // its RateLimit-Policy item: "rule-limit";q=Q;w=W
	quoted   string // "rule-limit", for RateLimit items
	sk       *epochsketch.Sketch
	tick     time.Duration
	theta    uint32 // the threshold, in counts: burst x unit
	unit     uint32 // counts per request (LimitMath: 2 for an odd burst)
	requests float64
	per      time.Duration
}

type budgetState struct {
	cfg   *Budget
	sk    *epochsketch.Sketch
	tick  time.Duration
	theta uint32 // Units, in counts of Unit units
	// cost and reserve in counts (rounded up).
	cost, reserve uint32
	held          *countMin // counts reserved by requests in flight, per key
}

// New validates cfg and compiles it into a Middleware in front of next. It
// works on a copy with the defaults applied: cfg is not changed.
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
		clients:  newCountMin(),
		ruleMet:  map[string]*ruleMetrics{},
	}
	m.started = m.now()
	m.initRedaction()
	m.initMetrics()
	if err := m.Reload(cfg); err != nil {
		return nil, err
	}
	cfg = m.state.Load().cfg // the prepared copy
	if fa := cfg.ForwardAuth; fa != nil && fa.Listen == "" {
		m.startCheck = fa
	}
	if cfg.StateFile != "" {
		m.loadState()
		m.saverStop, m.saverDone = make(chan struct{}), make(chan struct{})
		go m.saver(time.Duration(cfg.StateEvery))
	}
	if cfg.Fleet != nil {
		m.fleet = newFleet(cfg.Fleet, m.log, m.now)
		m.reg.MustRegister(m.fleet.roundTime)
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
	cfg, err := cfg.prepared()
	if err != nil {
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
	build := func(rc Rule) *rule {
		ru := &rule{cfg: &rc}
		if len(rc.Match.Methods) > 0 {
			ru.methods = map[string]bool{}
			for _, mt := range rc.Match.Methods {
				ru.methods[mt] = true
			}
			// A HEAD is a GET without the body: upstreams (Go's, nginx's
			// limit_except) serve it with the GET handler.
			ru.methods[http.MethodHead] = ru.methods[http.MethodHead] || ru.methods[http.MethodGet]
		}
		for _, k := range rc.Key {
			if name, ok := strings.CutPrefix(k, "header:"); ok {
				ru.keyHeaders = append(ru.keyHeaders, http.CanonicalHeaderKey(name))
			}
			if name, ok := strings.CutPrefix(k, "query:"); ok {
				ru.keyQueries = append(ru.keyQueries, name)
			}
			ru.needJWT = ru.needJWT || strings.HasPrefix(k, "jwt:")
		}
		for i := range rc.Limits {
			l := &rc.Limits[i]
			tick := tickFor(l.Requests, time.Duration(l.Per), l.Burst)
			theta, unit := countsFor(l.Burst)
			lim := &limit{
				name: l.Name, policy: rc.Name + "-" + l.Name, tick: tick,
				theta: theta, unit: unit, requests: l.Requests, per: time.Duration(l.Per),
				sk: sketch(tick, cfg.Sketch.Buckets),
			}
			lim.q, lim.w = wholePolicy(l.Requests, time.Duration(l.Per))
			lim.quoted = strconv.Quote(lim.policy)
			lim.item = fmt.Sprintf("%s;q=%d;w=%d", lim.quoted, lim.q, lim.w)
			if ru.policy != "" {
				ru.policy += ", "
			}
			ru.policy += lim.item
			ru.limits = append(ru.limits, lim)
		}
		if b := rc.Budget; b != nil {
			tick := tickFor(b.Units, time.Duration(b.Per), b.Units)
			ru.budget = &budgetState{cfg: b, tick: tick, theta: thresholdFor(b.Units / float64(b.Unit)), sk: sketch(tick, cfg.Sketch.Buckets),
				cost: counts(b.Cost, b.Unit), reserve: counts(b.Reserve, b.Unit), held: newCountMin()}
		}
		var prev *rule // the same rule in the running config
		if old != nil {
			for _, o := range old.rules {
				if o.cfg.Name == rc.Name {
					prev = o
				}
			}
			for _, o := range old.rlsRules {
				if o.cfg.Name == rc.Name {
					prev = o
				}
			}
		}
		// Top offenders decay with the rule's first limit: the metric shows
		// today's, not yesterday's. Kept across a reload while that sketch is.
		switch {
		case len(ru.limits) == 0:
			ru.top = epochsketch.NewTopK(10) // never offered to
		case prev != nil && len(prev.limits) > 0 && prev.limits[0].sk == ru.limits[0].sk:
			ru.top = prev.top
		default:
			ru.top = epochsketch.NewTopKFor(ru.limits[0].sk, 10)
		}
		if rc.MaxInFlight > 0 {
			ru.inflight = newCountMin()
			if prev != nil && prev.inflight != nil {
				ru.inflight = prev.inflight // requests in flight stay counted
			}
		}
		if ru.budget != nil && prev != nil && prev.budget != nil && prev.budget.cfg.Name == ru.budget.cfg.Name && prev.budget.cfg.Unit == ru.budget.cfg.Unit {
			ru.budget.held = prev.budget.held // reservations in flight stay held
		}
		if m.ruleMet[rc.Name] == nil {
			m.ruleMet[rc.Name] = &ruleMetrics{latency: m.latency.WithLabelValues(rc.Name)}
		}
		ru.met = m.ruleMet[rc.Name]
		return ru
	}
	for _, rc := range cfg.Rules {
		st.rules = append(st.rules, build(rc))
	}
	if r := cfg.EnvoyRLS; r != nil {
		// Envoy's descriptors: rules no HTTP request matches, one per
		// descriptor with a limit, found through the domains' trees.
		st.rls = r.domains
		for _, rc := range r.rules {
			st.rlsRules = append(st.rlsRules, build(rc))
		}
	}
	if cfg.JWT != nil {
		var prev *jwtVerifier
		if old != nil {
			prev = old.jwt
		}
		v, err := newJWTVerifier(cfg.JWT, prev, m.log)
		if err != nil {
			m.met.reloads[1].Add(1)
			return &ConfigError{File: cfg.src, Field: "jwt", Msg: err.Error()}
		}
		st.jwt = v
	}
	// Side sketches: keys seen lately, new keys during a spike, and bans.
	st.known = sketch(time.Duration(cfg.NewKeys.Remember), cfg.Sketch.Buckets)
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
		if old.jwt != nil {
			old.jwt.stop(st.jwt)
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
	m.refusals.flush(m.log)
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
		if st.jwt != nil {
			st.jwt.stop(nil)
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

// verdict is a rule's decision with what the headers and the commit need.
type verdict struct {
	out   Outcome
	level float64 // (estimate + 1) / threshold of the most constrained limit
	ru    *rule   // nil for the per-client in-flight cap
	lim   *limit
	est   uint32 // the most constrained limit's estimate, this request included
	theta uint32
	retry time.Duration
	delay time.Duration
	key   string
	// Each limit's estimate before this request and its threshold (the new
	// keys' factor applied), in ru.limits order.
	ests, thetas []uint32
	newKey       bool // first seen during a spike of new keys
	banned       bool // under a ban already: not counted
	setBan       bool // climbed past ban_above: the commit bans it
	shadow       bool
	counted      bool // evaluate counted it already (refused: count)
	first        bool // its first request in the first limit's tick
}

func (v *verdict) worse(o *verdict) bool {
	if o.out != v.out {
		return o.out > v.out && o.out != Allowlisted
	}
	return o.level > v.level
}

// request holds what one request needs across rules.
type request struct {
	r *http.Request
	// host is the canonical Host without its port ("" when the request
	// has none); alt, for a forward-auth check whose gateway is not named,
	// the other hosts its headers give. path is the cleaned path rules
	// match ("/" for "OPTIONS *"), loose its folded form (loosePath).
	host, path, loose string
	alt               []string
	addr              netip.Addr
	client            string // addr grouped by prefix: the per-client cap's key
	ip                string
	query             url.Values
	claims            jwt.MapClaims // the verified bearer token's, once a rule needs them
	buf               []byte
	bp                *[]byte // buf's pool entry
	// refusal, if not 0, is the status of every refusal: a forward-auth
	// check's (ForwardAuthConfig.RefusalStatus).
	refusal int
}

// code is the status a refusal is sent with: c, or the check's.
func (rq *request) code(c int) int {
	if rq.refusal != 0 {
		return rq.refusal
	}
	return c
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
	case strings.HasPrefix(k, "jwt:"):
		if v, err := claimString(rq.claims, k[len("jwt:"):]); err == nil {
			return v // ServeHTTP has checked every claim a matched rule needs
		}
	}
	return "-"
}

func (ru *rule) matches(rq *request) bool {
	mt := ru.cfg.Match
	if mt.Host != "" && !rq.hostIs(mt.Host) {
		return false
	}
	if p := mt.PathPrefix; p != "" && !pathMatch(rq.path, p, mt.CaseSensitive) &&
		(rq.loose == rq.path || !pathMatch(rq.loose, p, mt.CaseSensitive)) {
		return false
	}
	return ru.methods == nil || ru.methods[rq.r.Method]
}

// hostIs reports whether a host rule for h applies: the request names h,
// or names no host at all (an HTTP/1.0 request without Host reaches the
// upstream's default host, which may be h).
func (rq *request) hostIs(h string) bool {
	if rq.host == h || rq.host == "" && len(rq.alt) == 0 {
		return true
	}
	for _, a := range rq.alt {
		if a == h {
			return true
		}
	}
	return false
}

// ambiguous says why a request's key cannot be read the way every upstream
// would read it, or "": a key header sent twice (the proxy would count one
// value and the upstream might use the other), or a header whose name
// differs from a key header only by '_' for '-' or by case (CGI, WSGI and
// Rack servers read X_API_Key as X-API-Key; nginx drops it). Query keys
// given twice are ambiguous the same way.
func (ru *rule) ambiguous(r *http.Request, q func() url.Values) string {
	for _, name := range ru.keyHeaders {
		if n := len(r.Header.Values(name)); n > 1 {
			return fmt.Sprintf("the key header %s is sent %d times", name, n)
		}
	}
	if len(ru.keyHeaders) > 0 {
		for h := range r.Header {
			if !strings.Contains(h, "_") {
				continue
			}
			alias := http.CanonicalHeaderKey(strings.ReplaceAll(h, "_", "-"))
			for _, name := range ru.keyHeaders {
				if alias == name {
					return fmt.Sprintf("the header %q reads as the key header %s to some upstreams", truncate(h, 64), name)
				}
			}
		}
	}
	for _, name := range ru.keyQueries {
		if n := len(q()[name]); n > 1 {
			return fmt.Sprintf("the key parameter %q is given %d times", name, n)
		}
	}
	return ""
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

// skey builds "rule\x00limit\x00key" in buf. Limit names are letters,
// digits, - and _, so the side sketches' tags (tagBan, ...) and budgets'
// "$name" never meet a limit's key.
func skey(buf []byte, a, b, key string) []byte {
	buf = append(buf[:0], a...)
	buf = append(buf, 0)
	buf = append(buf, b...)
	buf = append(buf, 0)
	return append(buf, key...)
}

const (
	tagBan   = "!ban"
	tagNew   = "!new"
	tagKnown = "!known"
)

// isNewKey reports whether key counts as new: first seen while new keys
// spike, within the last window or two. A key active in one of the rule's
// limits (active) is known; otherwise the memory of keys (new_keys.remember)
// says. Rules with limits teach that memory in commit, once per tick a key
// is active; budget-only rules here.
func (m *Middleware) isNewKey(st *state, ru *rule, rq *request, key string, now time.Time, active bool) bool {
	nk := &st.cfg.NewKeys
	if nk.Disabled {
		return false
	}
	// A mark lasts at most two windows: without one that recent, no key is
	// marked, and the lookup is skipped.
	if last := m.lastNew.Load(); last != 0 && now.UnixNano()-last <= 3*int64(nk.Window) {
		rq.buf = skey(rq.buf, ru.cfg.Name, tagNew, key)
		if st.newKeys.EstimateBytes(rq.buf) > 0 {
			return true
		}
	}
	if active {
		return false
	}
	rq.buf = skey(rq.buf, ru.cfg.Name, tagKnown, key)
	if len(ru.limits) > 0 {
		if st.known.EstimateBytes(rq.buf) > 0 {
			return false
		}
	} else if seen, _ := st.known.ObserveBytes(rq.buf); seen > 1 {
		return false
	}
	m.spike.first(now)
	if !m.spike.active(now, nk) || !m.warm(now, nk) {
		return false
	}
	// Marked for between one and two windows (a count of 2 halves to 0 at
	// the second window boundary).
	rq.buf = skey(rq.buf, ru.cfg.Name, tagNew, key)
	st.newKeys.ObserveBytesN(time.Time{}, rq.buf, 2)
	m.lastNew.Store(now.UnixNano())
	return true
}

// warm reports whether the spike meter has learned enough to call a spike.
func (m *Middleware) warm(now time.Time, nk *NewKeysConfig) bool {
	return m.restoredMeter.Load() || now.Sub(m.started) >= time.Duration(nk.Warmup)
}

// evaluate decides one rule for key at now without counting the request:
// the commit does that once every rule has decided.
func (m *Middleware) evaluate(st *state, ru *rule, rq *request, key string, now time.Time) verdict {
	v := verdict{ru: ru, key: key}
	cfg := st.cfg
	// A ban lasts at most 5 ticks of ban_for/4: without one that recent, no
	// key is banned, and the lookup is skipped.
	if last := m.lastBan.Load(); len(ru.limits) > 0 && last != 0 && now.UnixNano()-last <= 8*int64(st.banTick) {
		rq.buf = skey(rq.buf, ru.cfg.Name, tagBan, key)
		v.banned = st.bans.EstimateBytes(rq.buf) > 0
	}
	active := false
	if len(ru.limits) > 0 {
		v.ests = make([]uint32, 2*len(ru.limits))
		v.ests, v.thetas = v.ests[:len(ru.limits)], v.ests[len(ru.limits):]
	}
	// A rule that counts refused requests counts this one whatever the
	// verdicts (unless it is banned): it observes now, in one pass, and
	// its estimate before this request is the one after, less it.
	v.counted = ru.cfg.Refused == "count" && !v.banned
	for i, l := range ru.limits {
		rq.buf = skey(rq.buf, ru.cfg.Name, l.name, key)
		var est uint32
		if v.counted {
			after, first := l.sk.ObserveBytesN(time.Time{}, rq.buf, l.unit)
			after = m.fleet.estimate(rq.buf, l.sk, l.tick, l.theta, after, now)
			est = max(after, l.unit) - l.unit
			if i == 0 {
				v.first = first
			}
		} else {
			est = m.limitEstimate(rq.buf, l, now)
		}
		v.ests[i] = est
		active = active || est > 0
	}
	if len(ru.limits) > 0 || ru.budget != nil {
		v.newKey = m.isNewKey(st, ru, rq, key, now, active)
	}
	for i, l := range ru.limits {
		est := v.ests[i]
		theta := l.theta
		if v.newKey {
			theta = max(l.unit, uint32(float64(theta)*cfg.NewKeys.BudgetFactor))
		}
		v.thetas[i] = theta
		after := uint64(est) + uint64(l.unit)
		lv := float64(after) / float64(theta)
		if v.lim == nil || lv > v.level {
			v.level, v.lim, v.est, v.theta = lv, l, uint32(min(after, math.MaxUint32)), theta
		}
	}
	t := &cfg.Tarpit
	switch {
	case v.banned:
		v.out = Ban
	case v.lim == nil || v.level <= 1:
		v.out = Allow
	case !ru.cfg.Tarpit:
		v.out = Reject
	case v.level > t.BanAbove:
		v.out, v.setBan = Ban, true
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

// commit counts the request in a rule's limits, and bans the key if it
// climbed past ban_above.
func (m *Middleware) commit(st *state, v *verdict, rq *request) {
	ru := v.ru
	first := v.first
	for i, l := range ru.limits {
		if v.counted {
			break // evaluate observed already
		}
		rq.buf = skey(rq.buf, ru.cfg.Name, l.name, v.key)
		_, f := l.sk.ObserveBytesN(time.Time{}, rq.buf, l.unit)
		first = first || i == 0 && f
	}
	if first && len(ru.limits) > 0 && !st.cfg.NewKeys.Disabled {
		// Once per tick a key is active: the memory of keys grows with
		// activity, so the lottery keeps steady clients over one-off keys.
		rq.buf = skey(rq.buf, ru.cfg.Name, tagKnown, v.key)
		st.known.ObserveBytes(rq.buf)
	}
	if v.setBan {
		rq.buf = skey(rq.buf, ru.cfg.Name, tagBan, v.key)
		st.bans.ObserveBytesN(time.Time{}, rq.buf, 16) // 16 >> 4 ticks of ban_for/4: about ban_for
		m.lastBan.Store(m.now().UnixNano())
	}
}

// limitEstimate is a limit's count for the sketch key k (skey): this
// replica's estimate, or the fleet's where the key is heavy enough to share.
func (m *Middleware) limitEstimate(k []byte, l *limit, now time.Time) uint32 {
	return m.fleet.estimate(k, l.sk, l.tick, l.theta, l.sk.EstimateBytes(k), now)
}

// budgetEstimate is a wallet's spend for key and the threshold that applies.
func (m *Middleware) budgetEstimate(st *state, ru *rule, rq *request, key string, newKey bool, now time.Time) (est, theta uint32) {
	b := ru.budget
	rq.buf = skey(rq.buf, ru.cfg.Name, "$"+b.cfg.Name, key)
	est = b.sk.EstimateBytes(rq.buf)
	est = m.fleet.estimate(rq.buf, b.sk, b.tick, b.theta, est, now)
	theta = b.theta
	if newKey {
		theta = max(b.reserve, uint32(float64(theta)*st.cfg.NewKeys.BudgetFactor))
	}
	return est, theta
}

// counts is units in counts of unit, rounded up, at most a uint32.
func counts(units, unit uint64) uint32 {
	return uint32(min((units+unit-1)/unit, math.MaxUint32))
}

// checkBudget decides a wallet without charging it: OverBudget if the cost
// does not fit, BudgetUnknown if the fleet cannot say and the wallet fails
// closed.
func (m *Middleware) checkBudget(st *state, v *verdict, rq *request, now time.Time) (verdict, bool) {
	ru, key := v.ru, v.key
	b := ru.budget
	if f := m.fleet; f != nil && !f.up.Load() && f.cfg.WalletOnFailure == "closed" {
		return verdict{out: BudgetUnknown, ru: ru, key: key, retry: time.Duration(f.cfg.Interval)}, false
	}
	est, theta := m.budgetEstimate(st, ru, rq, key, v.newKey, now)
	held := uint64(max(0, b.held.get(ru.cfg.Name, key)))
	if uint64(est)+held+uint64(b.reserve) > uint64(theta) {
		return verdict{out: OverBudget, ru: ru, key: key, est: est, theta: theta,
			level: float64(est) / float64(theta)}, false
	}
	return verdict{}, true
}

// charge charges a wallet its cost and holds its reservation. It reports
// false when the sketch did not take the key (its bucket is full of bigger
// spenders): the spend is not tracked, so nothing was charged or held.
func (m *Middleware) charge(ru *rule, rq *request, key string) bool {
	b := ru.budget
	rq.buf = skey(rq.buf, ru.cfg.Name, "$"+b.cfg.Name, key)
	b.sk.ObserveBytesN(time.Time{}, rq.buf, b.cost)
	if b.sk.EstimateBytes(rq.buf) == 0 && !b.cfg.FailOpen {
		return false
	}
	b.held.add(ru.cfg.Name, key, int64(b.reserve))
	return true
}

// retryAll is how long a refused client must wait before its next request
// is let through by every rule it matches: the longest wait over every
// limit (with what this request added), every ban and every wallet, so
// that waiting Retry-After is always enough (for a client that sends
// nothing meanwhile).
func (m *Middleware) retryAll(st *state, vs []verdict, rq *request, now time.Time) time.Duration {
	var d time.Duration
	for i := range vs {
		v := &vs[i]
		if v.ru == nil || v.out == Allowlisted || v.shadow {
			continue
		}
		ru := v.ru
		for j, l := range ru.limits {
			rq.buf = skey(rq.buf, ru.cfg.Name, l.name, v.key)
			est := m.limitEstimate(rq.buf, l, now)
			if uint64(est)+uint64(l.unit) > uint64(v.thetas[j]) {
				d = max(d, retryAfter(est, l.unit, v.thetas[j], now, l.tick))
			}
		}
		if len(ru.limits) > 0 {
			rq.buf = skey(rq.buf, ru.cfg.Name, tagBan, v.key)
			if ban := st.bans.EstimateBytes(rq.buf); ban > 0 {
				d = max(d, retryAfter(ban, 1, 1, now, st.banTick))
			}
		}
		if b := ru.budget; b != nil {
			// Reservations of requests in flight may all be spent: wait as
			// if they were (in-flight requests end when they end).
			est, theta := m.budgetEstimate(st, ru, rq, v.key, v.newKey, now)
			need := min(uint64(theta), uint64(b.reserve)+uint64(max(0, b.held.get(ru.cfg.Name, v.key))))
			if uint64(est)+need > uint64(theta) {
				d = max(d, retryAfter(est, uint32(need), theta, now, b.tick))
			}
		}
	}
	return d
}

// ServeHTTP decides and then proxies, holds, or refuses the request.
//
// Every rule decides first, counting nothing. A request that every rule
// admits is then counted in every limit and charged to every wallet; a
// refused one is counted only by rules with refused: count, and charged to
// no wallet.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.checkHere(r.URL.Path) {
		m.forwardAuth(w, r) // the check's path, in any spelling, is never proxied
		return
	}
	m.serve(w, r, m.next, nil)
}

// checkHere reports whether p is the forward-auth check's path on the
// proxy's own listener: under the running config, or under the config the
// Middleware started with (a reload that moves the check to a listener of
// its own, or removes it, takes a restart to free the path here: until
// then it is answered by the check, never proxied).
func (m *Middleware) checkHere(p string) bool {
	if fa := m.state.Load().cfg.ForwardAuth; fa != nil && fa.Listen == "" && fa.isCheck(p) {
		return true
	}
	return m.startCheck != nil && m.startCheck.isCheck(p)
}

// check is what a forward-auth check adds to the request it judges.
type check struct {
	alt []string // hosts besides Host that a gateway not named may route on
}

// serve decides r and hands an admitted request to next. A check (the
// forward-auth endpoint) refuses with forward_auth.refusal_status and never
// drips.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, chk *check) {
	st := m.state.Load()
	now := m.now()
	begin := time.Now()
	m.met.requests.Add(1)
	var req request // on the stack, with room for the matched rules
	var room [8]*rule
	rq := &req
	var alt []string
	if chk != nil {
		alt = chk.alt
	}
	matched, ok := m.screen(w, r, st, rq, alt, room[:0])
	if !ok {
		return
	}
	defer rq.free()
	if chk != nil && st.cfg.ForwardAuth != nil {
		rq.refusal = st.cfg.ForwardAuth.RefusalStatus
	}
	if !m.holdClient(w, r, st, rq) {
		return
	}
	defer m.clients.add("", rq.client, -1)
	if len(matched) > 0 {
		defer func() {
			d := time.Since(begin).Seconds()
			for _, ru := range matched {
				ru.met.latency.Observe(d)
			}
		}()
	}
	verdicts, worst := m.decideAll(r, st, matched, rq, now)
	a, ok := m.reserve(r, st, verdicts, worst, rq, now)
	if !ok {
		return // the client went away while the tarpit held it
	}
	// Count: everything for an admitted request, only refused: count rules
	// for a refused one. A banned key's attempts are not counted: the ban
	// is its punishment.
	for i := range verdicts {
		v := &verdicts[i]
		if v.out != Allowlisted && len(v.ests) > 0 && !v.banned && (a.admitted || v.counted) {
			m.commit(st, v, rq)
		}
	}
	if !a.admitted {
		m.answerRefusal(w, r, st, verdicts, &a.refusal, rq, now)
		return
	}
	m.forward(w, r, next, st, verdicts, &a, rq, now)
}

// screen refuses what no rule can judge safely (an ambiguous path or key,
// 400; a key that needs a valid bearer token, 401), cleans the path, finds
// the client into rq, and appends the rules that match to matched. It
// returns false when it has answered the request.
func (m *Middleware) screen(w http.ResponseWriter, r *http.Request, st *state, rq *request, alt []string, matched []*rule) ([]*rule, bool) {
	switch {
	case r.Method == http.MethodConnect || r.Method == http.MethodTrace:
		// CONNECT opens a tunnel no rule can judge; TRACE echoes a
		// request's headers, cookies included, back to a script (nginx
		// refuses both).
		m.met.badRequests.Add(1)
		w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
		writeProblem(w, http.StatusMethodNotAllowed, r.Method+": this is a reverse proxy; it forwards neither tunnels nor traces")
		return nil, false
	case strings.ToUpper(r.Method) != r.Method:
		// Methods are case-sensitive, but some upstreams (Werkzeug, for
		// one) serve "get" as GET: no rule could tell. nginx answers 400 too.
		m.badRequest(w, r, fmt.Sprintf("the method %.32q is not in upper case", r.Method))
		return nil, false
	}
	if why := pathProblem(r); why != "" {
		m.badRequest(w, r, why)
		return nil, false
	}
	host, name, ok := canonicalHost(r.Host)
	if !ok {
		m.badRequest(w, r, fmt.Sprintf("the Host %.64q is not a host name or address with at most one port", r.Host))
		return nil, false
	}
	normalizePath(r)
	r.Host = host // what rules judged is what the upstream is sent
	*rq = request{r: r, addr: st.cfg.ClientIP.clientAddr(r), host: name, path: r.URL.Path, alt: alt}
	if rq.path == "*" {
		rq.path = "/" // OPTIONS *: the server as a whole
	}
	rq.loose = loosePath(rq.path)
	rq.bp = bufPool.Get().(*[]byte)
	rq.buf = (*rq.bp)[:0]
	query := func() url.Values {
		if rq.query == nil {
			rq.query = r.URL.Query()
		}
		return rq.query
	}
	for _, ru := range st.rules {
		if !ru.matches(rq) {
			continue
		}
		if why := ru.ambiguous(r, query); why != "" {
			rq.free()
			m.badRequest(w, r, why)
			return nil, false
		}
		if ru.needJWT && !m.verifyJWT(w, r, st, ru, rq) {
			rq.free()
			return nil, false
		}
		matched = append(matched, ru)
	}
	return matched, true
}

// free returns the request's key buffer to the pool.
func (rq *request) free() {
	if rq.bp != nil {
		*rq.bp = rq.buf[:0]
		bufPool.Put(rq.bp)
		rq.bp = nil
	}
}

// holdClient takes one of the client address's places for requests in
// progress (server.max_in_flight_per_client), or refuses the request with
// 429. The caller gives the place back when the request ends.
func (m *Middleware) holdClient(w http.ResponseWriter, r *http.Request, st *state, rq *request) bool {
	rq.client = st.cfg.ClientIP.group(rq.addr)
	n := *st.cfg.Server.MaxInFlightPerClient
	if n <= 0 {
		m.clients.add("", rq.client, 1) // counted, so the caller's release balances
		return true
	}
	if m.clients.acquire("", rq.client, n) {
		return true
	}
	m.met.clientCap.Add(1)
	closeIfBody(w, r)
	v := verdict{out: InFlight, key: rq.client, retry: time.Second}
	m.logDecision(r, &v, false)
	m.refuse(w, st, &v, nil, rq.code(http.StatusTooManyRequests))
	return false
}

// decideAll runs every matched rule's limits without counting, and returns
// the verdicts and the worst of the non-shadow ones.
func (m *Middleware) decideAll(r *http.Request, st *state, matched []*rule, rq *request, now time.Time) ([]verdict, verdict) {
	verdicts := make([]verdict, len(matched))
	worst := verdict{out: Allow}
	for i, ru := range matched {
		key := ru.key(&st.cfg.ClientIP, rq)
		if ru.allowlisted(rq.addr, key) {
			ru.met.count(Allowlisted, false)
			verdicts[i] = verdict{out: Allowlisted, ru: ru}
			continue
		}
		v := m.evaluate(st, ru, rq, key, now)
		if len(v.ests) > 0 {
			if u := ru.limits[0].unit; 2*(uint64(v.ests[0])+uint64(u)) > uint64(v.thetas[0]) {
				ru.top.Offer(key, v.ests[0]+u) // the first limit's: the TopK's clock
			}
		}
		if ru.cfg.Shadow {
			v.shadow = true
			if v.out != Allow {
				ru.met.count(v.out, true)
				m.logDecision(r, &v, true)
			}
		} else if worst.worse(&v) {
			worst = v
		}
		verdicts[i] = v
	}
	return verdicts, worst
}

// admission is what reserve decided: admitted, or the refusal; the wallets
// to charge (verdict indexes) and the in-flight places held.
type admission struct {
	admitted bool
	refusal  verdict
	charged  []int
	inflight []charge
}

// release gives the in-flight places back.
func (a *admission) release() {
	for _, c := range a.inflight {
		c.ru.inflight.add(c.ru.cfg.Name, c.key, -1)
	}
	a.inflight = nil
}

// reserve holds a delayed request in the tarpit, then reserves what can be
// given back (wallets' room, in-flight places) and charges the wallets of
// an admitted request. ok is false when the client left while held.
func (m *Middleware) reserve(r *http.Request, st *state, verdicts []verdict, worst verdict, rq *request, now time.Time) (a admission, ok bool) {
	a.refusal = worst
	a.admitted = worst.out == Allow || worst.out == Delay
	if worst.out == Delay {
		// Held before anything is reserved or charged: a client that
		// leaves while held costs nothing (its attempt counted already,
		// as every attempt does in a tarpit rule).
		if !m.hold(worst.ru.cfg.Name, worst.key, st) {
			a.refusal.out, a.admitted = TarpitFull, false
		} else {
			err := m.opts.Sleep(r.Context(), worst.delay)
			m.release(worst.ru.cfg.Name, worst.key)
			if err != nil {
				worst.ru.met.count(Delay, false)
				return a, false
			}
		}
	}
	if a.admitted {
		// From a wallet's check to its charge, no other request may check
		// the same wallet: two that both saw room for one more reservation
		// would both take it, past the budget.
		locked := m.wallets.lock(verdicts)
		defer m.wallets.unlock(locked)
	}
	for i := 0; a.admitted && i < len(verdicts); i++ {
		v := &verdicts[i]
		ru := v.ru
		if v.out == Allowlisted {
			continue
		}
		if ru.budget != nil {
			if bv, ok := m.checkBudget(st, v, rq, now); !ok {
				if v.shadow {
					ru.met.count(bv.out, true)
					m.logDecision(r, &bv, true)
				} else {
					a.refusal, a.admitted = bv, false
					break
				}
			} else {
				a.charged = append(a.charged, i)
			}
		}
		if ru.inflight != nil {
			if !ru.inflight.acquire(ru.cfg.Name, v.key, ru.cfg.MaxInFlight) {
				iv := verdict{out: InFlight, ru: ru, key: v.key}
				if v.shadow {
					ru.met.count(InFlight, true)
					m.logDecision(r, &iv, true)
					continue
				}
				a.refusal, a.admitted = iv, false
				break
			}
			a.inflight = append(a.inflight, charge{ru: ru, key: v.key})
		}
	}
	if a.admitted {
		for n, i := range a.charged {
			if !m.charge(verdicts[i].ru, rq, verdicts[i].key) {
				// An admission miss: the lottery may admit the key on a
				// retry, so it retries soon.
				a.refusal, a.admitted = verdict{out: BudgetUnknown, ru: verdicts[i].ru, key: verdicts[i].key, retry: time.Second}, false
				for _, k := range a.charged[:n] { // costs stay charged; reservations go
					b := verdicts[k].ru.budget
					b.held.add(verdicts[k].ru.cfg.Name, verdicts[k].key, -int64(b.reserve))
				}
				break
			}
		}
	}
	if !a.admitted {
		a.release()
	}
	return a, true
}

// walletLocks makes a wallet's check and its charge one step for each
// (rule, key): 64 mutexes, a wallet's chosen by its cell in the budget's
// held counts (the seeded hash of its rule and key). A request locks the
// stripes of all its wallets at once, in ascending order, so two requests
// with wallets in common cannot deadlock.
type walletLocks [64]sync.Mutex

// lock locks the stripes of the wallets among vs and returns them as a
// mask, for unlock.
func (l *walletLocks) lock(vs []verdict) uint64 {
	var mask uint64
	for i := range vs {
		if v := &vs[i]; v.ru != nil && v.ru.budget != nil && v.out != Allowlisted {
			cell, _ := v.ru.budget.held.idx(v.ru.cfg.Name, v.key)
			mask |= 1 << (cell & 63)
		}
	}
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Lock()
	}
	return mask
}

func (l *walletLocks) unlock(mask uint64) {
	for m := mask; m != 0; m &= m - 1 {
		l[bits.TrailingZeros64(m)].Unlock()
	}
}

// answerRefusal writes a refusal with a Retry-After that covers every
// limit, ban and wallet the request matched.
func (m *Middleware) answerRefusal(w http.ResponseWriter, r *http.Request, st *state, verdicts []verdict, refusal *verdict, rq *request, now time.Time) {
	closeIfBody(w, r)
	refusal.retry = max(refusal.retry, time.Second, m.retryAll(st, verdicts, rq, now))
	if refusal.out == InFlight {
		refusal.retry = time.Second // a place frees when a request ends: no promise
	}
	refusal.ru.met.count(refusal.out, false)
	m.logDecision(r, refusal, false)
	code := http.StatusTooManyRequests
	if refusal.out == BudgetUnknown {
		code = http.StatusServiceUnavailable
	}
	if refusal.out == Drip && rq.refusal == 0 {
		m.drip(w, r, st, refusal, verdicts)
		return
	}
	m.refuse(w, st, refusal, verdicts, rq.code(code))
}

// forward sends an admitted request on: the rate-limit fields, the body's
// deadline and buffer, the wallets' settlements, then the next handler.
func (m *Middleware) forward(w http.ResponseWriter, r *http.Request, next http.Handler, st *state, verdicts []verdict, a *admission, rq *request, now time.Time) {
	defer a.release()
	charged := a.charged
	for i := range verdicts {
		if v := &verdicts[i]; v.out == Allow || v.out == Delay {
			v.ru.met.count(v.out, false)
		}
	}
	if !st.cfg.Headers.Off {
		m.setHeaders(w.Header(), st, verdicts, rq, now, false)
	}
	if !m.prepareBody(w, r, &st.cfg.Server) {
		return
	}
	m.met.inFlight.Add(1)
	defer m.met.inFlight.Add(-1)
	if len(charged) > 0 {
		rcs := make(settlements, len(charged))
		for j, i := range charged {
			rcs[j] = &settlement{m: m, ru: verdicts[i].ru, key: verdicts[i].key}
		}
		var done func()
		r, done = m.detach(r, rcs)
		rw := &reconcileWriter{ResponseWriter: w, rcs: rcs}
		defer func() {
			// Usage sent as a trailer is in the header map now; whatever
			// was never reported, the reservation is released.
			rcs.settle(rw.Header(), true)
			rcs.release()
			done()
		}()
		w = rw
	}
	next.ServeHTTP(w, r)
}

// charge is a rule and the key a request was counted under in it.
type charge struct {
	ru  *rule
	key string
}

// reconcileWriter settles a request's wallets from the response header
// when the response starts (and, after the handler, from its trailers).
type reconcileWriter struct {
	http.ResponseWriter
	rcs  settlements
	done bool
}

func (rw *reconcileWriter) WriteHeader(code int) {
	if !rw.done && code >= 200 {
		rw.done = true
		rw.rcs.settle(rw.ResponseWriter.Header(), false)
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
	rows [2][1 << 12]atomic.Int64
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

func (c *countMin) add(rule, key string, d int64) int64 {
	i, j := c.idx(rule, key)
	return min(c.rows[0][i].Add(d), c.rows[1][j].Add(d))
}

func (c *countMin) get(rule, key string) int64 {
	i, j := c.idx(rule, key)
	return min(c.rows[0][i].Load(), c.rows[1][j].Load())
}

// acquire adds one unless the key already has limit.
func (c *countMin) acquire(rule, key string, limit int) bool {
	if n := c.add(rule, key, 1); n > int64(limit) {
		c.add(rule, key, -1)
		return false
	}
	return true
}

func formatNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// closeIfBody closes the connection after a refusal of a request whose body
// was not read: the server would otherwise read (and wait for) the whole
// body before it sends the answer, which a slow client drips for as long as
// it likes.
func closeIfBody(w http.ResponseWriter, r *http.Request) {
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// verifyJWT verifies the request's bearer token once and checks the claims
// ru's key needs; it answers 401 and reports false if they are not there.
func (m *Middleware) verifyJWT(w http.ResponseWriter, r *http.Request, st *state, ru *rule, rq *request) bool {
	if rq.claims == nil {
		c, err := st.jwt.claims(r)
		if err != nil {
			m.unauthorized(w, r, err)
			return false
		}
		rq.claims = c
	}
	for _, k := range ru.cfg.Key {
		if name, ok := strings.CutPrefix(k, "jwt:"); ok {
			if _, err := claimString(rq.claims, name); err != nil {
				m.unauthorized(w, r, err)
				return false
			}
		}
	}
	return true
}
