package fleet

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is what a fleet has done and how it stands now: what its metrics
// expose (Collect), for a caller that reads it without a registry.
type Stats struct {
	// Up: Redis answered the last round, and limits are fleet-wide.
	Up bool
	// Hearing: subscribed to the other replicas' claims.
	Hearing bool
	// Replicas is N; HotKeys, the keys in the hot set.
	Replicas, HotKeys int64
	// RTT is the last successful round's time; LastOK, when it ended
	// (zero before any).
	RTT    time.Duration
	LastOK time.Time
	// ClockSkew is how far this replica's clock is behind Redis's
	// (negative: ahead), as far as Redis's replies have shown it: 0 for
	// a clock within a round trip of Redis's.
	ClockSkew time.Duration

	Rounds, RoundErrors, KeySyncs, Commands uint64
	Promotions, Demotions, HotFull, Resends uint64
	Claims, ClaimsHeard, Rejected           uint64
	// Late counts the requests of keys just shared whose claims Redis
	// did not answer in time: decided as during an outage (claim.go).
	Late uint64
}

// Stats returns the fleet's figures now.
func (f *Fleet) Stats() Stats {
	s := Stats{
		Up: f.up.Load(), Hearing: f.hearing.Load(),
		Replicas: f.replicas(), HotKeys: f.count.Load(),
		RTT: time.Duration(f.rttNs.Load()), ClockSkew: time.Duration(f.skew.Load()),
		Rounds: f.rounds.Load(), RoundErrors: f.roundErrors.Load(), KeySyncs: f.keySyncs.Load(), Commands: f.commands.Load(),
		Promotions: f.promotions.Load(), Demotions: f.demotions.Load(), HotFull: f.hotFull.Load(), Resends: f.resends.Load(),
		Claims: f.claims.Load(), ClaimsHeard: f.claimsHeard.Load(), Rejected: f.rejected.Load(),
		Late: f.lates.Load(),
	}
	if ok := f.lastOK.Load(); ok > 0 {
		s.LastOK = time.Unix(0, ok)
	}
	return s
}

// desc is a metric the collector emits, with its type.
type desc struct {
	*prometheus.Desc
	typ prometheus.ValueType
}

func newDesc(name string, typ prometheus.ValueType, help string) desc {
	return desc{prometheus.NewDesc("sketchproxy_"+name, help, nil, nil), typ}
}

// The fleet's metrics (docs/metrics.md, The fleet), beside its round-time
// histogram.
var (
	dUp       = newDesc("fleet_up", prometheus.GaugeValue, "1 while Redis answers and limits are fleet-wide; 0: local at 1/N.")
	dReplicas = newDesc("fleet_replicas", prometheus.GaugeValue, "N, the replicas sharing the limits.")
	dHot      = newDesc("fleet_hot_keys", prometheus.GaugeValue, "Keys in the hot set, synced through Redis.")
	dRTT      = newDesc("fleet_redis_rtt_seconds", prometheus.GaugeValue, "The last successful round's time.")
	dLag      = newDesc("fleet_sync_lag_seconds", prometheus.GaugeValue, "Time since the last successful round.")
	dSkew     = newDesc("fleet_clock_skew_seconds", prometheus.GaugeValue, "How far this replica's clock is behind Redis's (negative: ahead), as Redis's replies show it; 0 within a round trip. Past 0.1 s it is warned, again only after it fell under half that: counts halve at other moments than the other replicas'.")
	dHearing  = newDesc("fleet_claims_subscribed", prometheus.GaugeValue, "1 while this replica hears the other replicas' claims (subscribed to the claims channel); the members channel, where heartbeats are heard, is subscribed apart and a refusal of it is logged.")
	counters  = []struct {
		d   desc
		get func(*Stats) uint64
	}{
		{newDesc("fleet_sync_rounds_total", prometheus.CounterValue, "Sync rounds tried."), func(s *Stats) uint64 { return s.Rounds }},
		{newDesc("fleet_sync_errors_total", prometheus.CounterValue, "Sync rounds that failed (Redis slow or gone)."), func(s *Stats) uint64 { return s.RoundErrors }},
		{newDesc("fleet_key_syncs_total", prometheus.CounterValue, "Hot keys sent in successful rounds."), func(s *Stats) uint64 { return s.KeySyncs }},
		{newDesc("fleet_redis_commands_total", prometheus.CounterValue, "Redis commands sent, all rounds."), func(s *Stats) uint64 { return s.Commands }},
		{newDesc("fleet_promotions_total", prometheus.CounterValue, "Keys promoted to the hot set."), func(s *Stats) uint64 { return s.Promotions }},
		{newDesc("fleet_demotions_total", prometheus.CounterValue, "Keys demoted from the hot set."), func(s *Stats) uint64 { return s.Demotions }},
		{newDesc("fleet_hot_set_full_total", prometheus.CounterValue, "Promotions refused because the hot set was full."), func(s *Stats) uint64 { return s.HotFull }},
		{newDesc("fleet_resends_total", prometheus.CounterValue, "Times Redis was found to have lost the shared counts (restarted empty); every replica writes its own again at its next round."), func(s *Stats) uint64 { return s.Resends }},
		{newDesc("fleet_claims_total", prometheus.CounterValue, "Hot keys sent at once because this replica counted past its guarantee and what Redis held for it (a claim on a key's pool), or claimed a count of a key just shared (its request waits for the answer): published to the other replicas."), func(s *Stats) uint64 { return s.Claims }},
		{newDesc("fleet_claims_heard_total", prometheus.CounterValue, "Claims on a key's pool published by any replica and heard by this one."), func(s *Stats) uint64 { return s.ClaimsHeard }},
		{newDesc("fleet_claims_late_total", prometheus.CounterValue, "Requests whose claims (a key just shared, or a count past the replica's guarantee) Redis did not answer within the fleet's timeout, or that could not wait for one: decided as while Redis is down, at 1/N."), func(s *Stats) uint64 { return s.Late }},
		{newDesc("fleet_records_rejected_total", prometheus.CounterValue, "Other replicas' records, claims and heartbeats not believed: no valid MAC (written without the fleet's secret, or by a replica older than signed records or members), or a heartbeat replayed past its window."), func(s *Stats) uint64 { return s.Rejected }},
	}
)

// Describe is prometheus.Collector's: every metric Collect emits.
func (f *Fleet) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []desc{dUp, dReplicas, dHot, dRTT, dLag, dHearing, dSkew} {
		ch <- d.Desc
	}
	for _, c := range counters {
		ch <- c.d.Desc
	}
	f.roundTime.Describe(ch)
}

// Collect is prometheus.Collector's: the fleet's figures at scrape time
// (Stats), and the round-time histogram.
func (f *Fleet) Collect(ch chan<- prometheus.Metric) {
	s := f.Stats()
	emit := func(d desc, v float64) { ch <- prometheus.MustNewConstMetric(d.Desc, d.typ, v) }
	emit(dUp, b2f(s.Up))
	emit(dReplicas, float64(s.Replicas))
	emit(dHot, float64(s.HotKeys))
	for _, c := range counters {
		emit(c.d, float64(c.get(&s)))
	}
	emit(dRTT, s.RTT.Seconds())
	lag := 0.0
	if !s.LastOK.IsZero() {
		lag = f.now().Sub(s.LastOK).Seconds()
	}
	emit(dLag, lag)
	emit(dHearing, b2f(s.Hearing))
	emit(dSkew, s.ClockSkew.Seconds())
	f.roundTime.Collect(ch)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ prometheus.Collector = (*Fleet)(nil)
