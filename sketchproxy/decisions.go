package sketchproxy

import (
	"sort"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Decisions calls f with the count of each rule's decisions by outcome, real
// (shadow false) and shadow, rules in name order, outcomes least severe
// first: every rule's real allow and reject, and the other counts that are
// not zero. They are sketchproxy_decisions_total's: since New, across
// reloads. It is for a host
// program that keeps its own metrics registry; f must not call back into
// the Middleware.
func (m *Middleware) Decisions(f func(rule string, o Outcome, shadow bool, n uint64)) {
	m.decisions(func(rule string, o Outcome, shadow bool, n, _ uint64) { f(rule, o, shadow, n) })
}

// decisions is Decisions with each count's hits (engine.Counts.Hits),
// which sketchproxy_envoy_rls_hits_total shows for Envoy's descriptors.
func (m *Middleware) decisions(f func(rule string, o Outcome, shadow bool, n, hits uint64)) {
	type named struct {
		name string
		c    *engine.Counts
	}
	var rules []named
	m.eng.Decisions(func(name string, c *engine.Counts) { rules = append(rules, named{name, c}) })
	sort.Slice(rules, func(i, j int) bool { return rules[i].name < rules[j].name })
	for _, ru := range rules {
		for o := Outcome(0); o < numOutcomes; o++ {
			for _, shadow := range [2]bool{false, true} {
				if v := ru.c.Get(o, shadow); v > 0 || (!shadow && (o == Allow || o == Reject)) {
					f(ru.name, o, shadow, v, ru.c.Hits(o, shadow))
				}
			}
		}
	}
}

// Outcome is what happened to a request under one rule: the engine's
// (internal/engine, verdict.go), so that metrics and Decisions read the
// engine's counts as they are. String returns the name logs and metrics
// write; Refuses reports whether it keeps a request from going on.
type Outcome = engine.Outcome

// The outcomes, least severe first.
const (
	Allow         = engine.Allow
	Allowlisted   = engine.Allowlisted   // the rule's allow list: no sketch work
	Delay         = engine.Delay         // held, then proxied
	Drip          = engine.Drip          // a 429 dripped slowly; never proxied
	TarpitFull    = engine.TarpitFull    // over the limit with the tarpit at its caps: an immediate 429
	InFlight      = engine.InFlight      // the key has max_in_flight requests running: 429
	BudgetUnknown = engine.BudgetUnknown // the wallet cannot be tracked: 503 (fail closed)
	OverBudget    = engine.OverBudget    // the wallet is spent: 429
	Reject        = engine.Reject        // over the limit: 429
	Ban           = engine.Ban           // far over the limit: 429 and Connection: close until the ban ends
	numOutcomes   = engine.NumOutcomes
)

// verdict is one rule's decision (engine.Verdict).
type verdict = engine.Verdict
