package sketchproxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/fleet"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/jwtauth"
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
	// end (0: DefaultRefusalLogInterval; see refusalLog).
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

	eng      *engine.Engine    // every decision; the only holder of sketches
	logs     engine.LogLimiter // refusal lines, logsPerSecond at most
	refusals refusalLog        // the decision log, aggregated by rule
	billLogs engine.LogLimiter // reconcile errors: a flood of refusals never hides them
	redact   []byte            // the key of the hash that stands for keys in logs and metrics

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
	ci    clientIP      // client_ip, compiled for the doors
	set   *engine.Set
	rules []*rule           // set.Rules, with what requests match
	jwt   *jwtauth.Verifier // nil without a jwt section
	// rlsLatency are the latency histograms of set.RLSRules, in order:
	// each ShouldRateLimit call is observed in those of the rules it
	// matched.
	rlsLatency []prometheus.Observer
	gen        int64
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
		var pj *jwtauth.Verifier
		if old != nil {
			pj = old.jwt
		}
		v, err := jwtauth.New(cfg.JWT, b.JWT(), pj, m.log)
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
	m.met.rls.Values.Retain(b.RLS().Detailed())
	m.state.Store(st)
	if old != nil {
		m.eng.Retire(old.set, set)
		if old.jwt != nil {
			old.jwt.Stop(st.jwt)
		}
	}
	return nil
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
			st.jwt.Stop(nil)
		}
	}
	return err
}

// initRedaction picks the key of the hash that stands for keys in logs and
// metrics: key_label_secret_file's secret (fixed), else one from
// Options.Seed for repeatable tests, else one drawn at random.
func (m *Middleware) initRedaction(secret []byte) {
	switch {
	case secret != nil:
		m.redact = secret
	case m.opts.Seed != 0:
		var seed [8]byte
		binary.LittleEndian.PutUint64(seed[:], m.opts.Seed)
		sum := sha256.Sum256(seed[:])
		m.redact = sum[:]
	default:
		m.redact = make([]byte, 32)
		rand.Read(m.redact)
	}
}
