package rls

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// observe logs an Envoy call's refusal and its shadow refusals, as the
// HTTP doors log theirs, and counts each detailed_metric descriptor's call
// under its value (shown by keyed hash, as every key in logs and metrics
// is).
func (s *Service) observe(domain string, ms []match, d *engine.Decision) {
	if !d.Admitted {
		// A copy: a pointer into d handed through the Host interface would
		// move every call's Decision to the heap, not only a refusal's.
		worst := d.Worst
		s.host.LogVerdict(&worst, false, d.Never, "door", "envoy_rls", "domain", domain)
	}
	for i := range ms {
		mt := &ms[i]
		if mt.fact < 0 {
			continue
		}
		v := &d.Verdicts[mt.fact]
		if v.Shadow && v.Out.Refuses() {
			s.host.LogVerdict(v, true, v.Never, "door", "envoy_rls", "domain", domain)
		}
		if mt.n.Detailed() {
			s.met.Values.Add(v.Rule.Name, s.host.Label(KeyValues(mt.key)), uint64(mt.hits), v.Over, d.Admitted && v.NearLimit())
		}
	}
}

// observeLatency observes a call's duration once in the latency
// histogram of each rule its descriptors matched (an unlimited descriptor
// has none), however many descriptors matched it.
func observeLatency(latency []prometheus.Observer, ms []match, secs float64) {
	var room [8]int
	seen := room[:0]
	var many map[int]bool // for many rules; a few are compared pairwise
	for i := range ms {
		mt := &ms[i]
		if mt.fact < 0 {
			continue
		}
		r := mt.n.Rule()
		switch {
		case many != nil:
			if many[r] {
				continue
			}
			many[r] = true
		case slices.Contains(seen, r):
			continue
		case len(seen) == cap(seen):
			many = map[int]bool{r: true}
			for _, o := range seen {
				many[o] = true
			}
		default:
			seen = append(seen, r)
		}
		latency[r].Observe(secs)
	}
}
