package caddyepochsketch

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// decisionsDesc is caddy_http_epochsketch_decisions_total: the engine's
// decisions by zone and outcome ("allow", "reject"; sketchproxy/docs/metrics.md
// lists the others), summed over the zones of that name. It counts from
// Caddy's start: the engine keeps its counts by zone name across reloads.
var decisionsDesc = prometheus.NewDesc("caddy_http_epochsketch_decisions_total",
	"Rate-limit decisions of the epochsketch handlers, by zone and outcome.",
	[]string{"zone", "outcome"}, nil)

// collector reads the engine's decision counts at scrape time: the hot
// path counts in the engine's atomics and nothing more.
type collector struct{}

func (collector) Describe(ch chan<- *prometheus.Desc) { ch <- decisionsDesc }

func (collector) Collect(ch chan<- prometheus.Metric) {
	sums := map[decisionLabel]uint64{}
	decisions(func(l decisionLabel, n uint64) { sums[l] += n })
	for l, n := range sums {
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(n), l.zone, l.outcome)
	}
}

// decisionLabel is a metric's labels: a zone's name and an outcome.
type decisionLabel struct{ zone, outcome string }

// eachDecision calls f with e's decisions by zone (a fleet's rule names
// carry a hash after the zone's name: fleet.go) and outcome, leaving out
// the outcomes never decided.
func eachDecision(e *engine.Engine, f func(decisionLabel, uint64)) {
	e.Decisions(func(rule string, c *engine.Counts) {
		for o := range engine.NumOutcomes {
			if n := c.Get(o, false); n != 0 { // no zone is in shadow mode
				f(decisionLabel{zoneOf(rule), o.String()}, n)
			}
		}
	})
}

// registerMetrics adds the collector to a config's registry (each config
// load has its own; its handlers register the one collector once).
func registerMetrics(reg *prometheus.Registry) error {
	if reg == nil {
		return nil
	}
	if err := reg.Register(collector{}); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
		return err
	}
	return nil
}
