package sketchproxy

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

type globalMetrics struct {
	requests        atomic.Uint64
	inFlight        atomic.Int64
	reloads         [2]atomic.Uint64 // ok, failed
	reconciled      atomic.Uint64
	reported        atomic.Uint64
	reconcileErrors atomic.Uint64
	stateSaves      [2]atomic.Uint64 // ok, failed
	stateLoads      [2]atomic.Uint64 // ok, rejected
	badRequests     atomic.Uint64
	unauthorized    atomic.Uint64
	clientCap       atomic.Uint64
	bodyTimeouts    atomic.Uint64

	rls rls.Metrics // Envoy's rate-limit service's calls and detailed_metric values
}

// initMetrics builds the Prometheus registry: the Go runtime's and the
// process's collectors, a request latency histogram per rule, and a
// collector that reads the proxy's counters and sketches at scrape time.
func (m *Middleware) initMetrics() {
	m.reg = prometheus.NewRegistry()
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sketchproxy_request_duration_seconds",
		Help:    "Time from a request's arrival to its answer (upstream included), by each rule it matched; for Envoy's service, each call once per rule its descriptors matched.",
		Buckets: latencyBuckets,
	}, []string{"rule"})
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.latency,
		(*collector)(m),
	)
}

// latencyBuckets are sketchproxy_request_duration_seconds' upper bounds:
// from 10 µs, as a ShouldRateLimit call or a forward-auth check takes about
// 50 µs (0.5 ms, the first bound until then, held them all), in steps of
// 1, 2.5 and 5 to 25 s, past the 16 s that was the last.
var latencyBuckets = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10, 25,
}

// MetricsHandler serves the Prometheus exposition formats (text, and
// OpenMetrics or protobuf on request) through client_golang's promhttp:
// decisions by rule and outcome, latency per rule, the tarpit, new keys,
// each sketch's Stats, each rule's top offenders (the library's TopK, with
// their current estimates, shown by keyed hash), the fleet, and the Go
// runtime and process.
func (m *Middleware) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

type desc struct {
	*prometheus.Desc
	typ prometheus.ValueType
}

func newDesc(name string, typ prometheus.ValueType, help string, labels ...string) desc {
	return desc{prometheus.NewDesc("sketchproxy_"+name, help, labels, nil), typ}
}

var (
	dRequests        = newDesc("requests_total", prometheus.CounterValue, "Requests seen.")
	dInFlight        = newDesc("requests_in_flight", prometheus.GaugeValue, "Requests being proxied now.")
	dDecisions       = newDesc("decisions_total", prometheus.CounterValue, "Decisions by rule and outcome; shadow=\"true\" were let through.", "rule", "outcome", "shadow")
	dBadRequests     = newDesc("bad_requests_total", prometheus.CounterValue, "Requests refused with 400 for an ambiguous path or key.")
	dUnauthorized    = newDesc("unauthorized_total", prometheus.CounterValue, "Requests refused with 401: a rule keyed on a token claim and no valid token.")
	dClientCap       = newDesc("client_in_flight_refused_total", prometheus.CounterValue, "Requests refused because their client address had server.max_in_flight_per_client in progress.")
	dBodyTimeouts    = newDesc("body_timeouts_total", prometheus.CounterValue, "Request bodies cut off at server.body_timeout.")
	dHeld            = newDesc("tarpit_held", prometheus.GaugeValue, "Requests held by the tarpit now (delayed or dripping).")
	dCapacity        = newDesc("tarpit_capacity", prometheus.GaugeValue, "The tarpit's global cap.")
	dNewKeys         = newDesc("new_keys_total", prometheus.CounterValue, "Keys seen for the first time within new_keys.remember.")
	dNewKeysRate     = newDesc("new_keys_per_second", prometheus.GaugeValue, "New keys in the last whole second (or this one, if more).")
	dSpike           = newDesc("new_key_spike", prometheus.GaugeValue, "1 while new keys spike: keys first seen now get the stricter budget.")
	dReloads         = newDesc("config_reloads_total", prometheus.CounterValue, "Configuration loads by result.", "result")
	dReconciled      = newDesc("budget_reconciled_units_total", prometheus.CounterValue, "Units charged from the upstream's reports beyond the up-front cost: what the wallets were charged, after rounding to the unit and saturation.")
	dReported        = newDesc("budget_reported_units_total", prometheus.CounterValue, "Units the upstream reported in reconcile headers and trailers (a report beyond 2^64-1 counts as 2^64-1).")
	dReconcileErrors = newDesc("budget_reconcile_errors_total", prometheus.CounterValue, "Reconcile reports that were not a whole number (logged; only the cost was charged).")
	dSketchBytes     = newDesc("sketch_bytes", prometheus.GaugeValue, "Memory of each sketch's table, by tick, the bursts its limits have (a power of two's range: 4-7, 8-15; 0 for the memory of keys, new keys and bans) and buckets.", "tick", "burst", "buckets")
	dTop             = newDesc("top_offender_level", prometheus.GaugeValue, "Each rule's heaviest keys now (by keyed hash): estimate / threshold of the rule's first limit.", "rule", "key")
	dStateSaves      = newDesc("state_saves_total", prometheus.CounterValue, "State file saves by result.", "result")
	dStateLoads      = newDesc("state_loads_total", prometheus.CounterValue, "State file loads at start by result.", "result")
	dGeneration      = newDesc("config_generation", prometheus.GaugeValue, "Reloads applied since start.")
	dRLSRequests     = newDesc("envoy_rls_requests_total", prometheus.CounterValue, "ShouldRateLimit calls of Envoy's rate-limit service.")
	dRLSHits         = newDesc("envoy_rls_hits_total", prometheus.CounterValue, "Hits of Envoy's descriptors (hits_addend, 0 meaning 1) by rule, outcome and shadow, as sketchproxy_decisions_total counts their decisions.", "rule", "outcome", "shadow")
	dRLSOverLimit    = newDesc("envoy_rls_over_limit_total", prometheus.CounterValue, "ShouldRateLimit calls answered OVER_LIMIT.")
	dRLSUnknown      = newDesc("envoy_rls_unknown_domain_total", prometheus.CounterValue, "ShouldRateLimit calls for a domain envoy_rls does not configure (answered OK).")
	dLimitRefusals   = newDesc("limit_refusals_total", prometheus.CounterValue, "Refusals by the limit the request was over (its rule's most constrained), beside its rule: which of a rule's limits refuses.", "rule", "limit")
	dNearLimit       = newDesc("decisions_near_limit_total", prometheus.CounterValue, "Admitted requests that left their key above 80% of its limit (envoyproxy/ratelimit's near_limit).", "rule")
	dValueHits       = newDesc("envoy_rls_value_hits_total", prometheus.CounterValue, "Hits of a detailed_metric descriptor, by the values it was sent with (keyed hash, as sketchproxy -key-label computes it); the 1,000 heaviest values of all such descriptors have a series, the rest count in other.", "rule", "value")
	dValueOver       = newDesc("envoy_rls_value_over_limit_total", prometheus.CounterValue, "Calls of a detailed_metric descriptor over its limit, by value.", "rule", "value")
	dValueNear       = newDesc("envoy_rls_value_near_limit_total", prometheus.CounterValue, "Calls of a detailed_metric descriptor admitted above 80% of its limit, by value.", "rule", "value")

	sketchStats = []struct {
		d   desc
		get func(engine.Stats) uint64
	}{
		{newDesc("sketch_evictions_total", prometheus.CounterValue, "Slots won from a live occupant.", "tick", "burst", "buckets"), func(s engine.Stats) uint64 { return s.Evictions }},
		{newDesc("sketch_chips_total", prometheus.CounterValue, "Counts taken from weakest occupants by the lottery.", "tick", "burst", "buckets"), func(s engine.Stats) uint64 { return s.Chips }},
		{newDesc("sketch_challenges_lost_total", prometheus.CounterValue, "Keys not tracked because their bucket was full of stronger keys.", "tick", "burst", "buckets"), func(s engine.Stats) uint64 { return s.ChallengesLost }},
		{newDesc("sketch_scrubbed_zombies_total", prometheus.CounterValue, "Slots silent for 24 ticks cleared.", "tick", "burst", "buckets"), func(s engine.Stats) uint64 { return s.ScrubbedZombies }},
		{newDesc("sketch_cas_retries_exhausted_total", prometheus.CounterValue, "Increments dropped after 4 lost compare-and-swaps.", "tick", "burst", "buckets"), func(s engine.Stats) uint64 { return s.CASRetriesExhausted }},
	}
)

// collector reads the Middleware's counters and sketches at scrape time;
// the fleet is a collector of its own (internal/fleet), registered by New.
type collector Middleware

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []desc{dRequests, dInFlight, dDecisions, dBadRequests, dUnauthorized, dClientCap, dBodyTimeouts, dHeld, dCapacity,
		dNewKeys, dNewKeysRate, dSpike, dReloads, dReconciled, dReported, dReconcileErrors, dSketchBytes, dTop, dStateSaves,
		dStateLoads, dGeneration, dRLSRequests, dRLSHits, dRLSOverLimit, dRLSUnknown, dLimitRefusals, dNearLimit, dValueHits, dValueOver, dValueNear} {
		ch <- d.Desc
	}
	for _, s := range sketchStats {
		ch <- s.d.Desc
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := (*Middleware)(c)
	st := m.state.Load()
	now := m.now()
	emit := func(d desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d.Desc, d.typ, v, labels...)
	}
	emit(dRequests, float64(m.met.requests.Load()))
	emit(dInFlight, float64(m.met.inFlight.Load()))
	emit(dBadRequests, float64(m.met.badRequests.Load()))
	emit(dUnauthorized, float64(m.met.unauthorized.Load()))
	emit(dClientCap, float64(m.met.clientCap.Load()))
	emit(dBodyTimeouts, float64(m.met.bodyTimeouts.Load()))
	emit(dRLSRequests, float64(m.met.rls.Requests.Load()))
	emit(dRLSOverLimit, float64(m.met.rls.OverLimit.Load()))
	emit(dRLSUnknown, float64(m.met.rls.UnknownDomain.Load()))

	m.decisions(func(rule string, o Outcome, shadow bool, n, hits uint64) {
		emit(dDecisions, float64(n), rule, o.String(), strconv.FormatBool(shadow))
		if rls.IsRule(rule) {
			emit(dRLSHits, float64(hits), rule, o.String(), strconv.FormatBool(shadow))
		}
	})
	m.eng.Decisions(func(rule string, c *engine.Counts) {
		emit(dNearLimit, float64(c.Near()), rule)
		c.Limits(func(limit string, n uint64) { emit(dLimitRefusals, float64(n), rule, limit) })
	})
	m.met.rls.Values.Each(func(rule, value string, c *rls.ValueCounts) {
		emit(dValueHits, float64(c.Hits), rule, value)
		emit(dValueOver, float64(c.Over), rule, value)
		emit(dValueNear, float64(c.Near), rule, value)
	})

	emit(dHeld, float64(m.eng.Held()))
	emit(dCapacity, float64(st.cfg.Tarpit.MaxHeld))
	spiking, newPerSecond, total := m.eng.Spiking(st.set, now)
	emit(dNewKeys, float64(total))
	emit(dNewKeysRate, newPerSecond)
	spike := 0.0
	if spiking {
		spike = 1
	}
	emit(dSpike, spike)
	emit(dReloads, float64(m.met.reloads[0].Load()), "ok")
	emit(dReloads, float64(m.met.reloads[1].Load()), "invalid")
	emit(dReconciled, float64(m.met.reconciled.Load()))
	emit(dReported, float64(m.met.reported.Load()))
	emit(dReconcileErrors, float64(m.met.reconcileErrors.Load()))

	st.set.SketchStats(func(tick time.Duration, class uint32, buckets int, stats engine.Stats) {
		t, u, b := tick.String(), burstRange(class), strconv.Itoa(buckets)
		for _, s := range sketchStats {
			emit(s.d, float64(s.get(stats)), t, u, b)
		}
		emit(dSketchBytes, float64(buckets*64), t, u, b)
	})

	for _, ru := range st.set.Rules {
		seen := map[string]bool{}
		m.eng.Top(ru, func(key string, level float64) {
			if k := m.display(key); !seen[k] {
				seen[k] = true
				emit(dTop, level, ru.Name, k)
			}
		})
	}
	emit(dStateSaves, float64(m.met.stateSaves[0].Load()), "ok")
	emit(dStateSaves, float64(m.met.stateSaves[1].Load()), "failed")
	emit(dStateLoads, float64(m.met.stateLoads[0].Load()), "ok")
	emit(dStateLoads, float64(m.met.stateLoads[1].Load()), "rejected")
	emit(dGeneration, float64(st.gen))
}

// burstRange is the bursts a sketch's threshold class holds, as its
// metrics label them: "4-7" (thresholds of 8 to 15 counts, rate.Unit a
// request), "1", or "0" for the side sketches (new keys, known keys, bans).
func burstRange(class uint32) string {
	if class == 0 {
		return "0"
	}
	lo, hi := uint64(1)<<(class-1)/rate.Unit, (uint64(1)<<class-1)/rate.Unit
	if lo == hi || lo == 0 {
		return strconv.FormatUint(hi, 10)
	}
	return strconv.FormatUint(lo, 10) + "-" + strconv.FormatUint(hi, 10)
}
