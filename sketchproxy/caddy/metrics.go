package caddyepochsketch

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// decisionsDesc is caddy_http_epochsketch_decisions_total: the engine's
// decisions by zone and outcome ("allow", "reject"; sketchproxy's README
// lists the others), summed over the Middlewares in the pool. A counter
// that restarts from zero when a reload changes a handler's zones (their
// Middleware is new), as Prometheus expects of a restarted process.
var decisionsDesc = prometheus.NewDesc("caddy_http_epochsketch_decisions_total",
	"Rate-limit decisions of the epochsketch handlers, by zone and outcome.",
	[]string{"zone", "outcome"}, nil)

// collector reads the pooled Middlewares' decision counts at scrape time:
// the hot path counts in the engine's atomics and nothing more.
type collector struct{}

func (collector) Describe(ch chan<- *prometheus.Desc) { ch <- decisionsDesc }

func (collector) Collect(ch chan<- prometheus.Metric) {
	type label struct{ zone, outcome string }
	sums := map[label]uint64{}
	var order []label
	pool.Range(func(_, v any) bool {
		v.(pooled).Decisions(func(rule string, o sketchproxy.Outcome, shadow bool, n uint64) {
			if shadow {
				return // no zone is in shadow mode
			}
			l := label{rule, o.String()}
			if _, ok := sums[l]; !ok {
				order = append(order, l)
			}
			sums[l] += n
		})
		return true
	})
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
