package sketchproxy

import (
	"sync"
	"sync/atomic"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// maxValueSeries bounds the per-value series of one detailed_metric
// descriptor, "other" included: its first values each get their own;
// later ones are counted under the value "other", so no client can grow
// the metrics.
const maxValueSeries = 100

// rlsValues counts each detailed_metric descriptor's calls per value.
type rlsValues struct {
	mu    sync.Mutex
	rules map[string]map[string]*valueCounts // rule name → value label → counts
}

// valueCounts are one value's calls: hits, and those over or near the
// limit.
type valueCounts struct{ hits, over, near atomic.Uint64 }

// get returns the counts of value under rule, or those of "other" once
// the rule has maxValueSeries values.
func (r *rlsValues) get(rule, value string) *valueCounts {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rules == nil {
		r.rules = map[string]map[string]*valueCounts{}
	}
	vs := r.rules[rule]
	if vs == nil {
		vs = map[string]*valueCounts{}
		r.rules[rule] = vs
	}
	c := vs[value]
	if c == nil {
		if len(vs) >= maxValueSeries-1 {
			value = "other"
			if c = vs[value]; c != nil {
				return c
			}
		}
		c = &valueCounts{}
		vs[value] = c
	}
	return c
}

// each calls f with every value's counts, under the lock.
func (r *rlsValues) each(f func(rule, value string, c *valueCounts)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for rule, vs := range r.rules {
		for value, c := range vs {
			f(rule, value, c)
		}
	}
}

// rlsObserve logs an Envoy call's refusal and its shadow refusals, as the
// HTTP doors log theirs, and counts each detailed_metric descriptor's call
// under its value (shown by keyed hash, as every key in logs and metrics
// is).
func (m *Middleware) rlsObserve(domain string, ms []rlsMatch, d *engine.Decision) {
	if !d.Admitted {
		m.logVerdict(&d.Worst, false, d.Never, "door", "envoy_rls", "domain", domain)
	}
	for i := range ms {
		mt := &ms[i]
		if mt.fact < 0 {
			continue
		}
		v := &d.Verdicts[mt.fact]
		if v.Shadow && v.Out.Refuses() {
			m.logVerdict(v, true, v.Never, "door", "envoy_rls", "domain", domain)
		}
		if mt.n.detailed {
			c := m.rlsValues.get(v.Rule.Name, m.display(mt.key))
			c.hits.Add(uint64(mt.hits))
			if v.Over {
				c.over.Add(1)
			} else if d.Admitted && v.NearLimit() {
				c.near.Add(1)
			}
		}
	}
}
