package caddyepochsketch

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// decisionsDesc is caddy_http_epochsketch_decisions_total: the engine's
// decisions by zone and outcome ("allow", "reject"; sketchproxy's README
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
	type label struct{ zone, outcome string }
	sums := map[label]uint64{}
	var order []label
	for _, e := range allEngines() {
		e.Decisions(func(zone string, c *engine.Counts) {
			for o := range engine.NumOutcomes {
				n := c.Get(o, false) // no zone is in shadow mode
				if n == 0 {
					continue
				}
				l := label{zone, o.String()}
				if _, ok := sums[l]; !ok {
					order = append(order, l)
				}
				sums[l] += n
			}
		})
	}
	for _, l := range order {
		ch <- prometheus.MustNewConstMetric(decisionsDesc, prometheus.CounterValue, float64(sums[l]), l.zone, l.outcome)
	}
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
