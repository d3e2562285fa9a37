package sketchproxy

import "sort"

// Decisions calls f with the count of each rule's decisions by outcome, real
// (shadow false) and shadow, rules in name order, outcomes least severe
// first: every rule's real allow and reject, and the other counts that are
// not zero. They are sketchproxy_decisions_total's: since New, across
// reloads. It is for a host
// program that keeps its own metrics registry (the Caddy module's
// caddy/metrics.go); f must not call back into the Middleware.
func (m *Middleware) Decisions(f func(rule string, o Outcome, shadow bool, n uint64)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	names := make([]string, 0, len(m.ruleMet))
	for n := range m.ruleMet {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		rm := m.ruleMet[name]
		for o := Outcome(0); o < numOutcomes; o++ {
			for s := range rm.n[o] {
				if v := rm.n[o][s].Load(); v > 0 || (s == 0 && (o == Allow || o == Reject)) {
					f(name, o, s == 1, v)
				}
			}
		}
	}
}
