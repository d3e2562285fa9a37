package sketchproxy

import (
	"bufio"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch"
)

// ruleMetrics counts one rule's decisions by outcome, real and shadow. It
// survives reloads (by rule name).
type ruleMetrics struct {
	n [numOutcomes][2]atomic.Uint64
}

func (r *ruleMetrics) count(o Outcome, shadow bool) {
	i := 0
	if shadow {
		i = 1
	}
	r.n[o][i].Add(1)
}

type globalMetrics struct {
	requests        atomic.Uint64
	inFlight        atomic.Int64
	reloads         [2]atomic.Uint64 // ok, failed
	reconciled      atomic.Uint64
	reconcileErrors atomic.Uint64
	stateSaves      [2]atomic.Uint64 // ok, failed
	stateLoads      [2]atomic.Uint64 // ok, rejected
}

// MetricsHandler serves the Prometheus text format: decisions by rule and
// outcome, the tarpit, first sightings, each sketch's Stats, and each rule's
// top offenders (from the library's TopK, with their current estimates).
func (m *Middleware) MetricsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		bw := bufio.NewWriter(w)
		m.writeMetrics(bw)
		bw.Flush()
	})
}

func (m *Middleware) writeMetrics(w *bufio.Writer) {
	st := m.state.Load()
	now := m.now()
	metric := func(name, typ, help string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
	}
	metric("sketchproxy_requests_total", "counter", "Requests seen.")
	fmt.Fprintf(w, "sketchproxy_requests_total %d\n", m.met.requests.Load())
	metric("sketchproxy_requests_in_flight", "gauge", "Requests being proxied now.")
	fmt.Fprintf(w, "sketchproxy_requests_in_flight %d\n", m.met.inFlight.Load())

	metric("sketchproxy_decisions_total", "counter", "Decisions by rule and outcome; shadow=\"true\" were let through.")
	m.mu.Lock()
	names := make([]string, 0, len(m.ruleMet))
	for n := range m.ruleMet {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		rm := m.ruleMet[n]
		for o := Outcome(0); o < numOutcomes; o++ {
			for s, shadow := range []string{"false", "true"} {
				if v := rm.n[o][s].Load(); v > 0 || (s == 0 && (o == Allow || o == Reject)) {
					fmt.Fprintf(w, "sketchproxy_decisions_total{rule=%q,outcome=%q,shadow=%q} %d\n", n, o.String(), shadow, v)
				}
			}
		}
	}
	m.mu.Unlock()

	metric("sketchproxy_tarpit_held", "gauge", "Requests held by the tarpit now (delayed or dripping).")
	fmt.Fprintf(w, "sketchproxy_tarpit_held %d\n", m.held.Load())
	metric("sketchproxy_tarpit_capacity", "gauge", "The tarpit's global cap.")
	fmt.Fprintf(w, "sketchproxy_tarpit_capacity %d\n", st.cfg.Tarpit.MaxHeld)

	metric("sketchproxy_first_sightings_total", "counter", "Keys seen for the first time in their tick.")
	fmt.Fprintf(w, "sketchproxy_first_sightings_total %d\n", m.spike.total.Load())
	metric("sketchproxy_first_sightings_per_second", "gauge", "First sightings in the last whole second (or this one, if more).")
	fmt.Fprintf(w, "sketchproxy_first_sightings_per_second %g\n", m.spike.rate(now))
	metric("sketchproxy_new_key_spike", "gauge", "1 while first sightings spike: new keys get the stricter budget.")
	spike := 0
	if !st.cfg.NewKeys.Disabled && m.spike.active(now, &st.cfg.NewKeys) {
		spike = 1
	}
	fmt.Fprintf(w, "sketchproxy_new_key_spike %d\n", spike)

	metric("sketchproxy_config_reloads_total", "counter", "Configuration loads by result.")
	fmt.Fprintf(w, "sketchproxy_config_reloads_total{result=\"ok\"} %d\n", m.met.reloads[0].Load())
	fmt.Fprintf(w, "sketchproxy_config_reloads_total{result=\"invalid\"} %d\n", m.met.reloads[1].Load())
	metric("sketchproxy_budget_reconciled_units_total", "counter", "Units charged from the upstream's reconcile header beyond the up-front cost.")
	fmt.Fprintf(w, "sketchproxy_budget_reconciled_units_total %d\n", m.met.reconciled.Load())
	metric("sketchproxy_budget_reconcile_errors_total", "counter", "Reconcile headers that were not a whole number.")
	fmt.Fprintf(w, "sketchproxy_budget_reconcile_errors_total %d\n", m.met.reconcileErrors.Load())

	// Sketch self-metrics, one series per sketch (by tick).
	type sk struct {
		k sketchKey
		s *epochsketch.Sketch
	}
	var sks []sk
	for k, s := range st.sketches {
		sks = append(sks, sk{k, s})
	}
	sort.Slice(sks, func(i, j int) bool {
		return sks[i].k.tick < sks[j].k.tick || sks[i].k.tick == sks[j].k.tick && sks[i].k.buckets < sks[j].k.buckets
	})
	stats := []struct {
		name, help string
		get        func(epochsketch.Stats) uint64
	}{
		{"evictions", "Slots won from a live occupant.", func(s epochsketch.Stats) uint64 { return s.Evictions }},
		{"chips", "Counts taken from weakest occupants by the lottery.", func(s epochsketch.Stats) uint64 { return s.Chips }},
		{"challenges_lost", "Keys not tracked because their bucket was full of stronger keys.", func(s epochsketch.Stats) uint64 { return s.ChallengesLost }},
		{"scrubbed_zombies", "Slots silent for 24 ticks cleared.", func(s epochsketch.Stats) uint64 { return s.ScrubbedZombies }},
		{"cas_retries_exhausted", "Increments dropped after 4 lost compare-and-swaps.", func(s epochsketch.Stats) uint64 { return s.CASRetriesExhausted }},
	}
	all := make([]epochsketch.Stats, len(sks))
	for i, s := range sks {
		all[i] = s.s.Stats()
	}
	for _, d := range stats {
		name := "sketchproxy_sketch_" + d.name + "_total"
		metric(name, "counter", d.help)
		for i, s := range sks {
			fmt.Fprintf(w, "%s{tick=%q,buckets=\"%d\"} %d\n", name, s.k.tick.String(), s.k.buckets, d.get(all[i]))
		}
	}
	metric("sketchproxy_sketch_bytes", "gauge", "Memory of each sketch's table.")
	for _, s := range sks {
		fmt.Fprintf(w, "sketchproxy_sketch_bytes{tick=%q,buckets=\"%d\"} %d\n", s.k.tick.String(), s.k.buckets, s.k.buckets*64)
	}

	metric("sketchproxy_top_offender_level", "gauge", "Each rule's heaviest keys now: estimate / threshold of the rule's first limit.")
	for _, ru := range st.rules {
		if len(ru.limits) == 0 {
			continue
		}
		l := ru.limits[0]
		for _, e := range ru.top.List() {
			est := l.sk.EstimateBytes(skey(nil, ru.cfg.Name, l.name, e.Key))
			if est == 0 {
				continue
			}
			fmt.Fprintf(w, "sketchproxy_top_offender_level{rule=%q,key=%s} %s\n", ru.cfg.Name,
				strconv.Quote(ru.display(e.Key)), strconv.FormatFloat(float64(est)/float64(l.theta), 'g', 4, 64))
		}
	}
	if f := m.fleet; f != nil {
		up := 0
		if f.up.Load() {
			up = 1
		}
		metric("sketchproxy_fleet_up", "gauge", "1 while Redis answers and limits are fleet-wide; 0: local at 1/N.")
		fmt.Fprintf(w, "sketchproxy_fleet_up %d\n", up)
		metric("sketchproxy_fleet_replicas", "gauge", "N, the replicas sharing the limits.")
		fmt.Fprintf(w, "sketchproxy_fleet_replicas %d\n", f.replicas())
		metric("sketchproxy_fleet_hot_keys", "gauge", "Keys in the hot set, synced through Redis.")
		fmt.Fprintf(w, "sketchproxy_fleet_hot_keys %d\n", f.count.Load())
		for _, c := range []struct {
			name, help string
			v          uint64
		}{
			{"sync_rounds_total", "Sync rounds tried.", f.rounds.Load()},
			{"sync_errors_total", "Sync rounds that failed (Redis slow or gone).", f.roundErrors.Load()},
			{"key_syncs_total", "Hot keys sent in successful rounds.", f.keySyncs.Load()},
			{"redis_commands_total", "Redis commands sent, all rounds.", f.commands.Load()},
			{"promotions_total", "Keys promoted to the hot set.", f.promotions.Load()},
			{"demotions_total", "Keys demoted from the hot set.", f.demotions.Load()},
			{"hot_set_full_total", "Promotions refused because the hot set was full.", f.hotFull.Load()},
		} {
			metric("sketchproxy_fleet_"+c.name, "counter", c.help)
			fmt.Fprintf(w, "sketchproxy_fleet_%s %d\n", c.name, c.v)
		}
		metric("sketchproxy_fleet_redis_rtt_seconds", "gauge", "The last successful round's time.")
		fmt.Fprintf(w, "sketchproxy_fleet_redis_rtt_seconds %g\n", time.Duration(f.rttNs.Load()).Seconds())
		lag := 0.0
		if ok := f.lastOK.Load(); ok > 0 {
			lag = now.Sub(time.Unix(0, ok)).Seconds()
		}
		metric("sketchproxy_fleet_sync_lag_seconds", "gauge", "Time since the last successful round.")
		fmt.Fprintf(w, "sketchproxy_fleet_sync_lag_seconds %g\n", lag)
	}
	metric("sketchproxy_state_saves_total", "counter", "State file saves by result.")
	fmt.Fprintf(w, "sketchproxy_state_saves_total{result=\"ok\"} %d\n", m.met.stateSaves[0].Load())
	fmt.Fprintf(w, "sketchproxy_state_saves_total{result=\"failed\"} %d\n", m.met.stateSaves[1].Load())
	metric("sketchproxy_state_loads_total", "counter", "State file loads at start by result.")
	fmt.Fprintf(w, "sketchproxy_state_loads_total{result=\"ok\"} %d\n", m.met.stateLoads[0].Load())
	fmt.Fprintf(w, "sketchproxy_state_loads_total{result=\"rejected\"} %d\n", m.met.stateLoads[1].Load())
	metric("sketchproxy_config_generation", "gauge", "Reloads applied since start.")
	fmt.Fprintf(w, "sketchproxy_config_generation %d\n", st.gen)
}
