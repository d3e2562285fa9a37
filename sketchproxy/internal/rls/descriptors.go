package rls

import (
	"math"
	"slices"
	"strconv"
	"strings"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Descriptors to facts: each descriptor of a call is matched against its
// domain's tree, and those with a counted or blocking limit become the
// engine's facts.

// match is one descriptor of a request, as matched against the domain's
// tree: the node it leads to (nil: no limit applies) and the fact it
// becomes.
type match struct {
	n    *config.RLSNode
	fact int // its index among the request's facts; -1: none
	hits uint32
	zero bool // hits_addend of 0 on the descriptor: judged, not counted
	neg  bool // is_negative_hits
	key  string
}

// matchDescriptors matches each descriptor of req against the domain's
// tree root (nil: an unknown domain), appending one match per
// descriptor to ms.
func matchDescriptors(root *config.RLSNode, req *rlsv3.RateLimitRequest, ms []match) []match {
	hits := req.GetHitsAddend()
	if hits == 0 {
		hits = 1
	}
	replaced := false
	var key strings.Builder
	for _, d := range req.GetDescriptors() {
		mt := matchOne(root, d, hits, &key)
		replaced = replaced || mt.n != nil && len(mt.n.Replaces()) > 0
		ms = append(ms, mt)
	}
	if replaced {
		dropReplaced(ms)
	}
	return ms
}

// matchOne walks the tree from root along d's entries, writing the key of
// the node it reaches into key (each value with its length, so that no two
// descriptors meet); hits is the call's hits_addend, which d's own
// replaces.
func matchOne(root *config.RLSNode, d *rlv3.RateLimitDescriptor, hits uint32, key *strings.Builder) match {
	mt := match{fact: -1, hits: hits, neg: d.GetIsNegativeHits()}
	if ha := d.GetHitsAddend(); ha != nil {
		mt.hits = uint32(min(ha.GetValue(), math.MaxUint32))
		mt.zero = mt.hits == 0
	}
	n := root
	key.Reset()
	for _, e := range d.GetEntries() {
		if n == nil {
			break // past the tree: no limit
		}
		var shared bool
		v := e.GetValue()
		if n, shared = n.Child(e.GetKey(), v); shared {
			v = n.Pattern() // share_threshold: one count for every matching value
		}
		key.WriteString(strconv.Itoa(len(v)))
		key.WriteByte(':')
		key.WriteString(v)
	}
	// No entries lead nowhere: no limit, as in envoyproxy/ratelimit.
	if len(d.GetEntries()) > 0 && n != nil && n.Limit() != config.RLSNone {
		mt.n, mt.key = n, key.String()
	}
	return mt
}

// dropReplaced takes the limit off every match whose limit another
// matched limit replaces. Every matched limit's replaces count, even a
// replaced one's.
func dropReplaced(ms []match) {
	gone := make([]bool, len(ms))
	for i, mt := range ms {
		gone[i] = mt.n != nil && mt.n.Name() != "" && replacedBy(ms, mt.n.Name())
	}
	for i := range ms {
		if gone[i] {
			ms[i].n = nil
		}
	}
}

// factsOf turns the matched descriptors with a counted or blocking limit
// into the engine's facts (unlimited ones need none), noting each one's
// index. A descriptor given twice in one call (Envoy sends a virtual
// host's and a route's rate_limits alike) is one fact with the hits of
// both, so that they fit or not together: apart, the first could be
// counted and the second refused.
func factsOf(set *engine.Set, ms []match, facts []engine.Fact) []engine.Fact {
	type same struct {
		rule            *engine.Rule
		key             string
		zero, neg, quot bool
	}
	var seen map[same]int // for many descriptors; a few are compared pairwise
	if len(ms) > 8 {
		seen = map[same]int{}
	}
	for i := range ms {
		mt := &ms[i]
		if mt.n == nil || mt.n.Limit() == config.RLSUnlimited {
			continue
		}
		f := engine.Fact{
			Rule: set.RLSRules[mt.n.Rule()], Key: mt.key, Hits: mt.hits,
			ZeroHits: mt.zero, Negative: mt.neg, Quota: mt.n.Quota(),
		}
		k := same{f.Rule, f.Key, f.ZeroHits, f.Negative, f.Quota}
		mt.fact = -1
		if seen != nil {
			if j, ok := seen[k]; ok {
				mt.fact = j
			}
		} else {
			for j := range facts {
				if o := &facts[j]; (same{o.Rule, o.Key, o.ZeroHits, o.Negative, o.Quota}) == k {
					mt.fact = j
				}
			}
		}
		if mt.fact >= 0 {
			facts[mt.fact].Hits = uint32(min(uint64(facts[mt.fact].Hits)+uint64(f.Hits), math.MaxUint32))
			continue
		}
		mt.fact = len(facts)
		if seen != nil {
			seen[k] = mt.fact
		}
		facts = append(facts, f)
	}
	return facts
}

// replacedBy reports whether a matched descriptor's limit replaces the
// limit named name.
func replacedBy(ms []match, name string) bool {
	for _, o := range ms {
		if o.n != nil && slices.Contains(o.n.Replaces(), name) {
			return true
		}
	}
	return false
}
