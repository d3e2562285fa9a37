package sketchproxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/fleet"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/keysrc"
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

	eng       *engine.Engine    // every decision; the only holder of sketches
	rlsValues rlsValues         // Envoy's detailed_metric descriptors, per value
	logs      engine.LogLimiter // refusal lines, logsPerSecond at most
	refusals  refusalLog        // the decision log, aggregated by rule
	billLogs  engine.LogLimiter // reconcile errors: a flood of refusals never hides them
	redact    []byte            // the key of the hash that stands for keys in logs and metrics

	transport atomic.Bool // Transport is in use: wallet requests outlive their clients

	mu        sync.Mutex // one Reload at a time; guards latencies and savesHeld
	latencies map[string]prometheus.Observer
	savesHeld bool // HandOverState: a successor owns the state file
	met       globalMetrics
	reg       *prometheus.Registry
	latency   *prometheus.HistogramVec

	fleet *fleet.Fleet // nil without Config.Fleet

	saverStop, saverDone chan struct{} // the state file's saver, if any
	closeOnce            sync.Once
	closeErr             error
}

// state is one configuration: the config, its compiled rule set, and what
// the HTTP doors match with.
type state struct {
	cfg   *Config
	b     *config.Built // what cfg compiled to (Envoy's domains: b.RLS())
	ci    clientIP      // client_ip, with its trusted proxies
	set   *engine.Set
	rules []*rule      // set.Rules, with what requests match
	jwt   *jwtVerifier // nil without a jwt section
	// rlsLatency are the latency histograms of set.RLSRules, in order:
	// each ShouldRateLimit call is observed in those of the rules it
	// matched.
	rlsLatency []prometheus.Observer
	gen        int64
}

// rule is a compiled rule with what the HTTP doors need to match a request
// and build its key.
type rule struct {
	eng     *engine.Rule
	cfg     *Rule
	allow   *config.AllowSet
	methods map[string]bool
	// keyHeaders and keyQueries are the key's header:NAME (canonical) and
	// query:NAME parts, checked for ambiguity.
	keyHeaders, keyQueries []string
	needJWT                bool // a key part is a claim of the bearer token
	latency                prometheus.Observer
}

// New validates cfg and compiles it into a Middleware in front of next. It
// works on a copy with the defaults applied: cfg is not changed.
func New(cfg *Config, next http.Handler, opts Options) (*Middleware, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Sleep == nil {
		opts.Sleep = engine.Sleep
	}
	m := &Middleware{
		next:      next,
		opts:      opts,
		log:       opts.Logger,
		latencies: map[string]prometheus.Observer{},
	}
	b, err := config.Build(cfg)
	if err != nil {
		return nil, err
	}
	eo := engine.Options{Clock: opts.Clock, Seed: opts.Seed, Sleep: opts.Sleep}
	if f := b.Config().Fleet; f != nil {
		// The fleet is built before the engine, which asks it, and
		// starts once the state file has given it the last membership
		// seen; its settings take a restart.
		m.fleet = fleet.New(f, b.Fleet(), m.log, m.now)
		eo.Fleet = m.fleet
	}
	m.eng = engine.New(eo)
	m.initRedaction(b.LabelKey())
	m.initMetrics()
	if err := m.install(b); err != nil {
		if m.fleet != nil {
			m.fleet.Close()
		}
		return nil, err
	}
	m.met.reloads[0].Add(1)
	cfg = m.state.Load().cfg // the prepared copy
	if fa := cfg.ForwardAuth; fa != nil && fa.Listen == "" {
		m.startCheck = fa
	}
	if cfg.StateFile != "" {
		m.loadState()
		m.saverStop, m.saverDone = make(chan struct{}), make(chan struct{})
		go m.saver(time.Duration(cfg.StateEvery))
	}
	if m.fleet != nil {
		m.fleet.Start()
		m.reg.MustRegister(m.fleet)
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

// Reload switches to cfg: it compiles cfg into a new rule set, then swaps it
// in. Sketches whose tick and size are unchanged are kept, with their
// counts; the others start empty. If cfg is invalid the current
// configuration stays and the error says why.
func (m *Middleware) Reload(cfg *Config) error {
	b, err := config.Build(cfg)
	if err == nil {
		err = m.install(b)
	}
	if err != nil {
		m.met.reloads[1].Add(1)
		return err
	}
	m.met.reloads[0].Add(1)
	return nil
}

// install compiles b, a config with what it built, and swaps it in.
func (m *Middleware) install(b *config.Built) error {
	if old := m.state.Load(); old != nil && (old.cfg.Fleet == nil) != (b.Config().Fleet == nil) {
		return &ConfigError{File: b.File(), Field: "fleet", Msg: "adding or removing the fleet takes a restart"}
	}
	if m.fleet != nil {
		b = b.WithFleet(m.fleet.Config()) // fleet settings take a restart; the rules reload
	}
	cfg := b.Config()
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.state.Load()
	st := &state{cfg: cfg, b: b, ci: clientIPOf(b)}
	var prev *engine.Set
	if old != nil {
		st.gen, prev = old.gen+1, old.set
	}
	set, err := m.eng.Compile(b.Spec(), prev)
	if err != nil {
		return &ConfigError{File: b.File(), Msg: err.Error()}
	}
	st.set = set
	if cfg.JWT != nil {
		// Last: a verifier may take over the running one's key fetcher,
		// so nothing may fail after it.
		var pj *jwtVerifier
		if old != nil {
			pj = old.jwt
		}
		v, err := newJWTVerifier(cfg.JWT, b.JWT(), pj, m.log)
		if err != nil {
			m.eng.Retire(set, prev)
			return &ConfigError{File: b.File(), Field: "jwt", Msg: err.Error()}
		}
		st.jwt = v
	}
	for i := range cfg.Rules {
		st.rules = append(st.rules, m.matcher(&cfg.Rules[i], b.Allow(i), set.Rules[i]))
	}
	for _, ru := range set.RLSRules {
		st.rlsLatency = append(st.rlsLatency, m.observer(ru.Name))
	}
	m.dropLatencies(set)
	m.rlsValues.retain(b.RLS().Detailed())
	m.state.Store(st)
	if old != nil {
		m.eng.Retire(old.set, set)
		if old.jwt != nil {
			old.jwt.stop(st.jwt)
		}
	}
	return nil
}

// matcher is rc as the HTTP doors match it, deciding through ru.
func (m *Middleware) matcher(rc *Rule, allow *config.AllowSet, ru *engine.Rule) *rule {
	r := &rule{eng: ru, cfg: rc, allow: allow, latency: m.observer(rc.Name)}
	if len(rc.Match.Methods) > 0 {
		r.methods = map[string]bool{}
		for _, mt := range rc.Match.Methods {
			r.methods[mt] = true
		}
		// A HEAD is a GET without the body: upstreams (Go's, nginx's
		// limit_except) serve it with the GET handler.
		r.methods[http.MethodHead] = r.methods[http.MethodHead] || r.methods[http.MethodGet]
	}
	for _, k := range rc.Key {
		if name, ok := strings.CutPrefix(k, "header:"); ok {
			r.keyHeaders = append(r.keyHeaders, http.CanonicalHeaderKey(name))
		}
		if name, ok := strings.CutPrefix(k, "query:"); ok {
			r.keyQueries = append(r.keyQueries, name)
		}
		r.needJWT = r.needJWT || strings.HasPrefix(k, "jwt:")
	}
	return r
}

// observer is the latency histogram of the rule named name, kept across
// reloads. m.mu is held.
func (m *Middleware) observer(name string) prometheus.Observer {
	o := m.latencies[name]
	if o == nil {
		o = m.latency.WithLabelValues(name)
		m.latencies[name] = o
	}
	return o
}

// dropLatencies removes the latency series of the rules set no longer
// has, so that reloads that rename rules or Envoy descriptors do not add
// series for the life of the process. m.mu is held.
func (m *Middleware) dropLatencies(set *engine.Set) {
	keep := make(map[string]bool, len(set.Rules)+len(set.RLSRules))
	for _, rs := range [2][]*engine.Rule{set.Rules, set.RLSRules} {
		for _, ru := range rs {
			keep[ru.Name] = true
		}
	}
	for name := range m.latencies {
		if !keep[name] {
			m.latency.DeleteLabelValues(name)
			delete(m.latencies, name)
		}
	}
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
		m.fleet.Close()
	}
	if st := m.state.Load(); st != nil {
		m.eng.Retire(st.set, nil)
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

// Outcome is what happened to a request under one rule: the engine's
// (internal/engine, verdict.go), so that metrics and Decisions read the
// engine's counts as they are. String returns the name logs and metrics
// write; Refuses reports whether it keeps a request from going on.
type Outcome = engine.Outcome

// The outcomes, least severe first.
const (
	Allow         = engine.Allow
	Allowlisted   = engine.Allowlisted   // the rule's allow list: no sketch work
	Delay         = engine.Delay         // held, then proxied
	Drip          = engine.Drip          // a 429 dripped slowly; never proxied
	TarpitFull    = engine.TarpitFull    // over the limit with the tarpit at its caps: an immediate 429
	InFlight      = engine.InFlight      // the key has max_in_flight requests running: 429
	BudgetUnknown = engine.BudgetUnknown // the wallet cannot be tracked: 503 (fail closed)
	OverBudget    = engine.OverBudget    // the wallet is spent: 429
	Reject        = engine.Reject        // over the limit: 429
	Ban           = engine.Ban           // far over the limit: 429 and Connection: close until the ban ends
	numOutcomes   = engine.NumOutcomes
)

// verdict is one rule's decision (engine.Verdict).
type verdict = engine.Verdict

// request holds what one request needs across rules.
type request struct {
	r *http.Request
	// host is the canonical Host without its port ("" when the request
	// has none); alt, for a forward-auth check whose gateway is not named,
	// the other hosts its headers give. path is the cleaned path rules
	// match ("/" for "OPTIONS *"), loose its folded form (httpnorm.LoosePath).
	host, path, loose string
	alt               []string
	addr              netip.Addr
	client            string // addr grouped by prefix: the per-client cap's key
	ip                string
	methods           Methods         // what rules with methods match (MethodsOf)
	claims            jwt.MapClaims   // the verified bearer token's, once a rule needs them
	sc                *engine.Scratch // from scratchPool; nil once freed
	// refusal, if not 0, is the status of every refusal: a forward-auth
	// check's (ForwardAuthConfig.RefusalStatus).
	refusal int
}

// code is the status a refusal is sent with: c, or the check's
// refusal_status when a gateway needs its own (nginx's 401 or 403). With
// the default 429 the check answers as the proxy does: 503 where the
// refusal is not the client's doing.
func (rq *request) code(c int) int {
	if rq.refusal != 0 && rq.refusal != http.StatusTooManyRequests {
		return rq.refusal
	}
	return c
}

var scratchPool = sync.Pool{New: func() any { return new(engine.Scratch) }}

func (rq *request) part(ci *ClientIPConfig, k string) string {
	switch {
	case k == "ip":
		if rq.ip == "" {
			rq.ip = ci.Group(rq.addr)
		}
		return rq.ip
	case strings.HasPrefix(k, "header:"):
		name := http.CanonicalHeaderKey(k[len("header:"):])
		if v := rq.r.Header.Get(name); v != "" {
			if keysrc.IsCredentials(name) {
				return keysrc.Credentials(v) // "bearer abc" is "Bearer  abc"
			}
			return v
		}
	case strings.HasPrefix(k, "query:"):
		// Every spelling an application reads as the name ("api.key" to
		// PHP), with ';' a separator too: ambiguous has refused two.
		if vs := keysrc.Query(rq.r.URL.RawQuery, k[len("query:"):]); len(vs) > 0 && vs[0] != "" {
			return vs[0]
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
	if p := mt.PathPrefix; p != "" && !httpnorm.PathMatch(rq.path, p, mt.CaseSensitive) &&
		(rq.loose == rq.path || !httpnorm.PathMatch(rq.loose, p, mt.CaseSensitive)) {
		return false
	}
	return ru.methods == nil || rq.methods.In(ru.methods)
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
func (ru *rule) ambiguous(r *http.Request) string {
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
		if n := len(keysrc.Query(r.URL.RawQuery, name)); n > 1 {
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
	return ru.allow.Allows(addr, key)
}

// ServeHTTP decides and then proxies, holds, or refuses the request.
//
// Every rule decides first, counting nothing. A request that every rule
// admits is then counted in every limit and charged to every wallet; a
// refused one is counted only by rules with refused: count, and charged to
// no wallet (engine.Decide).
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
	if fa := m.state.Load().cfg.ForwardAuth; fa != nil && fa.Listen == "" && isCheck(fa, p) {
		return true
	}
	return m.startCheck != nil && isCheck(m.startCheck, p)
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
	if len(matched) > 0 {
		defer func() {
			d := time.Since(begin).Seconds()
			for _, ru := range matched {
				ru.latency.Observe(d)
			}
		}()
	}
	d := m.decide(r, st, matched, rq, now, chk != nil)
	defer d.Done()
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.Shadow && v.Out.Refuses() {
			m.logDecision(r, v, true, v.Never)
		}
	}
	switch {
	case d.Gone: // the client went away while the tarpit held it
	case !d.Admitted:
		m.answerRefusal(w, r, st, &d, rq)
	default:
		m.forward(w, r, next, st, &d)
	}
}

// decide hands the request's facts to the engine: for each matched rule,
// the request's key under it and whether the rule's allow list exempts it.
func (m *Middleware) decide(r *http.Request, st *state, matched []*rule, rq *request, now time.Time, check bool) engine.Decision {
	var room [8]engine.Fact
	facts := room[:0]
	for _, ru := range matched {
		key := ru.key(&st.cfg.ClientIP, rq)
		facts = append(facts, engine.Fact{Rule: ru.eng, Key: key, Allowlisted: ru.allowlisted(rq.addr, key)})
	}
	rq.client = st.cfg.ClientIP.Group(rq.addr)
	return m.eng.Decide(r.Context(), st.set, now, &engine.Request{
		Facts: facts, Client: rq.client, ClientCap: *st.cfg.Server.MaxInFlightPerClient, NoDrip: check,
	}, rq.sc)
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
	if why := httpnorm.PathProblem(r); why != "" {
		m.badRequest(w, r, why)
		return nil, false
	}
	host, name, ok := httpnorm.CanonicalHost(r.Host)
	if !ok {
		m.badRequest(w, r, fmt.Sprintf("the Host %.64q is not a host name or address with at most one port", r.Host))
		return nil, false
	}
	httpnorm.NormalizePath(r)
	r.Host = host // what rules judged is what the upstream is sent
	*rq = request{r: r, addr: st.ci.clientAddr(r), host: name, path: r.URL.Path, alt: alt}
	if rq.path == "*" {
		rq.path = "/" // OPTIONS *: the server as a whole
	}
	rq.loose = httpnorm.LoosePath(rq.path)
	rq.methods = MethodsOf(r)
	rq.sc = scratchPool.Get().(*engine.Scratch)
	for _, ru := range st.rules {
		if !ru.matches(rq) {
			continue
		}
		if why := ru.ambiguous(r); why != "" {
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
	if rq.sc != nil {
		rq.sc.Reset()
		scratchPool.Put(rq.sc)
		rq.sc = nil
	}
}

// answerRefusal writes a refusal: 429 (503 for a wallet that cannot be
// tracked, or the forward-auth check's status), dripped if the tarpit
// says so.
func (m *Middleware) answerRefusal(w http.ResponseWriter, r *http.Request, st *state, d *engine.Decision, rq *request) {
	closeIfBody(w, r)
	if d.Worst.Rule == nil {
		m.met.clientCap.Add(1) // server.max_in_flight_per_client
		d.Worst.Key = rq.client
	}
	m.logDecision(r, &d.Worst, false, d.Never)
	code := http.StatusTooManyRequests
	if d.Unavailable() {
		code = http.StatusServiceUnavailable
	}
	if d.Drip {
		m.drip(w, r, st, d)
		return
	}
	m.refuse(w, st, d, rq.code(code))
}

// forward sends an admitted request on: the rate-limit fields, the body's
// deadline and buffer, the wallets' settlements, then the next handler.
func (m *Middleware) forward(w http.ResponseWriter, r *http.Request, next http.Handler, st *state, d *engine.Decision) {
	if !st.cfg.Headers.Off {
		m.setHeaders(w.Header(), st, &d.Fields)
	}
	if !m.prepareBody(w, r, &st.cfg.Server) {
		return
	}
	m.met.inFlight.Add(1)
	defer m.met.inFlight.Add(-1)
	if len(d.Wallets) > 0 {
		rcs := make(settlements, len(d.Wallets))
		for i, wl := range d.Wallets {
			rcs[i] = &settlement{m: m, w: wl}
		}
		var done func()
		r, done = m.detach(r, rcs)
		rw := &reconcileWriter{ResponseWriter: w, rcs: rcs}
		defer func() {
			// Usage sent as a trailer is in the header map now; whatever
			// was never reported, Done releases the reservation (unless a
			// drain of the response still looks for the report).
			rcs.settle(rw.Header(), true)
			done()
		}()
		w = rw
	}
	next.ServeHTTP(w, r)
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

func formatNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

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
