package engine

import "time"

// Outcome is what happened to a request under one rule.
type Outcome uint8

// The outcomes, least severe first.
const (
	Allow         Outcome = iota
	Allowlisted           // the rule's allow list: no sketch work
	Delay                 // held, then proxied
	Drip                  // a 429 dripped slowly; never proxied
	TarpitFull            // over the limit with the tarpit at its caps: an immediate 429
	InFlight              // the key has max_in_flight requests running: 429
	BudgetUnknown         // the wallet cannot be tracked: 503 (fail closed)
	OverBudget            // the wallet is spent: 429
	Reject                // over the limit: 429
	Ban                   // far over the limit: 429 and Connection: close until the ban ends
	NumOutcomes
)

var outcomeNames = [...]string{"allow", "allowlisted", "delay", "drip", "tarpit_full", "in_flight", "budget_unknown", "over_budget", "reject", "ban"}

func (o Outcome) String() string { return outcomeNames[o] }

// Refuses reports whether o keeps a request from going on.
func (o Outcome) Refuses() bool { return o != Allow && o != Allowlisted && o != Delay }

// Verdict is one rule's decision on one request, with what the count, the
// wait and the fields need.
type Verdict struct {
	Out   Outcome
	Level float64 // (count + this request) / threshold of the most constrained limit
	Rule  *Rule   // nil for the per-client cap of requests in progress
	Limit *Limit  // the most constrained limit; nil if the rule has none
	Est   uint32  // its count with this request's hits
	Theta uint32  // its threshold (the new keys' share applied)
	// Retry is a refusal's own wait, where no count says it: a wallet's
	// fleet wait, an in-flight place. A shadow verdict that would have
	// refused gets the whole wait its refusal would have had (Never where
	// none is enough), for its log line.
	Retry time.Duration
	Delay time.Duration // Delay: how long the tarpit holds the request
	Key   string
	// Shadow: the rule decides, logs and counts, but never refuses.
	Shadow bool
	// Over: the request's hits do not fit in some limit now. Never: they
	// would not fit at a count of 0 (more than a whole limit, or a rule
	// that blocks every hit): no wait is enough.
	Over, Never bool
	// Quota: the fact was one quota among the request's (Fact.Quota).
	Quota bool

	// Per limit, in Rule.Limits order (slices of the Scratch): the count
	// now (this request's hits included once counted), the threshold
	// (the new keys' share applied), and the part of the count that other
	// replicas hold (a fleet's).
	ests, thetas, others []uint32
	// tell: bit i asks that the fleet be told once limit i counts the
	// request (Fleet.Counted); tellBudget, once its wallet is charged.
	tell       uint64
	tellBudget bool
	add        uint32 // the counts the request's hits add to each limit
	hits       uint32 // the hits its decision counts (Fact.hits)
	noCount    bool   // Fact.ZeroHits or Fact.Negative: never counted
	newKey     bool   // first seen during a spike of new keys
	banned     bool   // under a ban already: not counted
	setBan     bool   // climbed past ban_above: banned once decided
	counted    bool   // evaluate counted it already (refused: count)
	first      bool   // its first request in the first limit's tick
}

// Worse reports whether o is a worse outcome for the request than v: a
// more severe outcome, or the same one at a higher level. Allowlisted is
// never worse.
func (v *Verdict) Worse(o *Verdict) bool {
	if o.Out != v.Out {
		return o.Out > v.Out && o.Out != Allowlisted
	}
	return o.Level > v.Level
}

// before is limit i's count before this request's hits.
func (v *Verdict) before(i int) uint32 {
	if v.counted {
		return v.ests[i] - min(v.ests[i], v.add)
	}
	return v.ests[i]
}
