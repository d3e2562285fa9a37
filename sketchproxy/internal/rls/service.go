// Package rls is Envoy's rate-limit service (envoy.service.ratelimit.v3)
// over the decision engine, kept apart as envoyproxy/ratelimit keeps its
// config, limiter and service: package config holds envoy_rls's types and
// compiles its domains into descriptor trees, internal/engine decides, and
// this package only translates: each descriptor to a fact (the node of its
// domain's tree it leads to and its key), the decision to one status per
// descriptor and the response's headers and metadata. What it needs of the
// program it runs in (the running configuration, the clock, the refusal
// log and the key labels) a [Host] hands it; it never imports sketchproxy.
package rls

import (
	"context"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Snapshot is one configuration as the service reads it: the running one
// at the call's start, swapped whole on reload.
type Snapshot struct {
	Config  *config.EnvoyRLSConfig // envoy_rls (nil: off; every domain is unknown)
	RLS     *config.RLS            // its domains' descriptor trees
	Set     *engine.Set            // the rule set the engine decides with
	Latency []prometheus.Observer  // the latency histograms of Set.RLSRules, in order
}

// Host is what the service needs of the program it runs in.
type Host interface {
	// Snapshot is the running configuration.
	Snapshot() Snapshot
	// Now is the decisions' clock.
	Now() time.Time
	// LogVerdict logs a refusal (or a shadow one) as every door's are,
	// with the door's own attributes.
	LogVerdict(v *engine.Verdict, shadow, never bool, door ...any)
	// Label is a key as logs and metrics show it (a keyed hash).
	Label(key string) string
}

// Service answers Envoy's ShouldRateLimit calls from the envoy_rls domains
// of its Host's running configuration, deciding with eng and counting in
// met. It is safe for concurrent use.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	host Host
	eng  *engine.Engine
	met  *Metrics
}

// New is the service of host's configuration, deciding with eng.
func New(host Host, eng *engine.Engine, met *Metrics) *Service {
	return &Service{host: host, eng: eng, met: met}
}

// Register registers s and the standard gRPC health service on gs, and
// returns the health service. Both the server ("") and
// envoy.service.ratelimit.v3.RateLimitService report SERVING until the
// program sets them NOT_SERVING, as it starts draining.
func Register(gs *grpc.Server, s *Service) *health.Server {
	rlsv3.RegisterRateLimitServiceServer(gs, s)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, h)
	return h
}

// scratchPool holds the engine's per-call buffers.
var scratchPool = sync.Pool{New: func() any { return new(engine.Scratch) }}

// rlsMatch is one descriptor of a request, as matched against the domain's
// tree: the node it leads to (nil: no limit applies) and the fact it
// becomes.
type rlsMatch struct {
	n    *config.RLSNode
	fact int // its index among the request's facts; -1: none
	hits uint32
	zero bool // hits_addend of 0 on the descriptor: judged, not counted
	neg  bool // is_negative_hits
	key  string
}

// ShouldRateLimit answers Envoy: it matches every descriptor against the
// domain's tree as envoyproxy/ratelimit does (the limit of the node the
// whole descriptor leads to, unless another matched descriptor's limit
// replaces it; none: OK), hands the matched ones to the engine as one
// request's facts, and translates its decision into one status per
// descriptor and the response's headers. Each descriptor is judged on its
// own: one that is oversized, malformed or unknown never turns the call
// into an error (Envoy would let the whole request through), it only finds
// no limit, or is counted under a digest of its value (engine.MaxKey).
// Unknown domains are OK: the limiter fails open.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	begin := time.Now() // the latency histogram's clock, as the HTTP doors'
	st := s.host.Snapshot()
	now := s.host.Now()
	s.met.Requests.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain is empty: Envoy's ratelimit filter must name one")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no descriptors")
	}
	root := st.RLS.Domain(req.GetDomain())
	if root == nil {
		s.met.UnknownDomain.Add(1)
	}
	var mroom [8]rlsMatch
	var froom [8]engine.Fact
	matches := matchDescriptors(root, req, mroom[:0])
	facts := rlsFacts(st.Set, matches, froom[:0])
	sc := scratchPool.Get().(*engine.Scratch)
	defer func() { sc.Reset(); scratchPool.Put(sc) }()
	rc := st.Config
	d := s.eng.Decide(ctx, st.Set, now, &engine.Request{Facts: facts, NoDrip: true, Shadow: rc.ShadowMode}, sc)
	defer d.Done()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	for i := range matches {
		resp.Statuses[i] = rlsStatus(&matches[i], d.Verdicts, now)
	}
	if !d.Admitted {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		s.met.OverLimit.Add(1)
	}
	s.rlsObserve(req.GetDomain(), matches, &d)
	switch rc.ResponseHeaders {
	case config.RLSHeadersDraft:
		if d.Fields.Any {
			resp.ResponseHeadersToAdd = rlsDraftHeaders(&d)
		}
	case config.RLSHeadersRateLimit:
		resp.ResponseHeadersToAdd = rlsLimitHeaders(resp.Statuses)
	}
	if rc.ResponseDynamicMetadata {
		resp.DynamicMetadata = rlsMetadata(req, matches, d.Verdicts)
	}
	observeRLSLatency(st.Latency, matches, time.Since(begin).Seconds())
	return resp, nil
}

// observeRLSLatency observes a call's duration once in the latency
// histogram of each rule its descriptors matched (an unlimited descriptor
// has none), however many descriptors matched it.
func observeRLSLatency(latency []prometheus.Observer, ms []rlsMatch, secs float64) {
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

// matchDescriptors matches each descriptor of req against the domain's
// tree root (nil: an unknown domain), appending one rlsMatch per
// descriptor to ms.
func matchDescriptors(root *config.RLSNode, req *rlsv3.RateLimitRequest, ms []rlsMatch) []rlsMatch {
	hits := req.GetHitsAddend()
	if hits == 0 {
		hits = 1
	}
	replaced := false
	var key strings.Builder
	for _, d := range req.GetDescriptors() {
		mt := rlsMatch{fact: -1, hits: hits, neg: d.GetIsNegativeHits()}
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
			replaced = replaced || len(n.Replaces()) > 0
		}
		ms = append(ms, mt)
	}
	if replaced {
		// Every matched limit's replaces count, even a replaced one's.
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
	return ms
}

// rlsFacts turns the matched descriptors with a counted or blocking limit
// into the engine's facts (unlimited ones need none), noting each one's
// index. A descriptor given twice in one call (Envoy sends a virtual
// host's and a route's rate_limits alike) is one fact with the hits of
// both, so that they fit or not together: apart, the first could be
// counted and the second refused.
func rlsFacts(set *engine.Set, ms []rlsMatch, facts []engine.Fact) []engine.Fact {
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

// rlsStatus is one descriptor's status: OK without a limit; the maximum
// remaining for an unlimited one (as envoyproxy/ratelimit); else its
// verdict's code, limit, remaining and time until reset (none for a limit
// its hits can never fit: that would promise a pass). A descriptor over its
// limit reads OVER_LIMIT also under the global shadow_mode, as theirs
// (only the call's overall code is OK there); one in shadow_mode of its
// own, or a quota, reads OK.
func rlsStatus(mt *rlsMatch, vs []engine.Verdict, now time.Time) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	switch {
	case mt.n == nil:
		return st
	case mt.n.Limit() == config.RLSUnlimited:
		st.LimitRemaining = math.MaxUint32
		return st
	}
	v := &vs[mt.fact]
	st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: mt.n.Name(), RequestsPerUnit: mt.n.Requests(), Unit: rlsv3.RateLimitResponse_RateLimit_Unit(mt.n.Unit())}
	if rlsOver(v) {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if v.Never {
		return st // remaining 0, and no reset: it never comes
	}
	remaining, reset := v.Status(now)
	st.LimitRemaining = uint32(min(remaining, math.MaxUint32))
	st.DurationUntilReset = durationpb.New(reset)
	return st
}

// rlsOver reports whether a verdict's descriptor status reads OVER_LIMIT:
// over its limit, not a quota (a quota over stays OK, as in
// envoyproxy/ratelimit), and not in a shadow_mode of its own. The global
// shadow_mode, which only turns the call's overall code OK, does not
// count.
func rlsOver(v *engine.Verdict) bool {
	return v.Over && !v.Quota && !v.Rule.Shadow
}

// rlsDraftHeaders are the RateLimit-Policy and RateLimit fields, and
// Retry-After on a refusal that a wait can end (response_headers: draft).
func rlsDraftHeaders(d *engine.Decision) []*corev3.HeaderValue {
	hs := []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: d.Fields.Policy}}
	if len(d.Fields.RateLimit) > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "RateLimit", Value: string(d.Fields.RateLimit)})
	}
	if !d.Admitted && !d.Never {
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(rate.Seconds(d.Retry), 10)})
	}
	return hs
}

// rlsLimitHeaders are envoyproxy/ratelimit's headers (response_headers:
// ratelimit): RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of
// the most limiting descriptor, chosen as theirs chooses it: the last
// descriptor over its limit, or, with none over, the first with the least
// remaining (a quota or a shadow descriptor competes by its remaining
// only). Under the global shadow_mode they are sent as without it, as
// theirs. Reset is the seconds until its count leaves room (theirs: until
// the window's end), left out where none ever will.
func rlsLimitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var most *rlsv3.RateLimitResponse_DescriptorStatus
	over := false
	for _, st := range sts {
		switch {
		case st.GetCurrentLimit() == nil:
		case st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			most, over = st, true // the last over wins, as theirs
		case over:
		case most == nil, st.GetLimitRemaining() < most.GetLimitRemaining():
			most = st
		}
	}
	if most == nil {
		return nil
	}
	hs := []*corev3.HeaderValue{
		{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(most.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(most.GetLimitRemaining()), 10)},
	}
	if r := most.GetDurationUntilReset(); r != nil {
		hs = append(hs, &corev3.HeaderValue{Key: "RateLimit-Reset", Value: strconv.FormatInt(rate.Seconds(r.AsDuration()), 10)})
	}
	return hs
}

// rlsMetadata is the call as envoyproxy/ratelimit's dynamic metadata
// gives it (response_dynamic_metadata): its domain, its descriptors'
// entries as key=value, its hits, and which descriptors were over a quota.
func rlsMetadata(req *rlsv3.RateLimitRequest, ms []rlsMatch, vs []engine.Verdict) *structpb.Struct {
	var descs, violations []*structpb.Value
	quotas := false
	for i, d := range req.GetDescriptors() {
		var es []*structpb.Value
		for _, e := range d.GetEntries() {
			es = append(es, structpb.NewStringValue(e.GetKey()+"="+e.GetValue()))
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: es})}
		if h := d.GetHitsAddend(); h != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
		if mt := &ms[i]; mt.fact >= 0 && mt.n.Quota() {
			quotas = true
			if vs[mt.fact].Over {
				violations = append(violations, structpb.NewNumberValue(float64(i)))
			}
		}
	}
	f := map[string]*structpb.Value{
		"domain":           structpb.NewStringValue(req.GetDomain()),
		"descriptors":      structpb.NewListValue(&structpb.ListValue{Values: descs}),
		"quotaModeEnabled": structpb.NewBoolValue(quotas),
	}
	if h := req.GetHitsAddend(); h != 0 {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	if len(violations) > 0 {
		f["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: violations})
	}
	return &structpb.Struct{Fields: f}
}

// replacedBy reports whether a matched descriptor's limit replaces the
// limit named name.
func replacedBy(ms []rlsMatch, name string) bool {
	for _, o := range ms {
		if o.n != nil && slices.Contains(o.n.Replaces(), name) {
			return true
		}
	}
	return false
}

// rlsObserve logs an Envoy call's refusal and its shadow refusals, as the
// HTTP doors log theirs, and counts each detailed_metric descriptor's call
// under its value (shown by keyed hash, as every key in logs and metrics
// is).
func (s *Service) rlsObserve(domain string, ms []rlsMatch, d *engine.Decision) {
	if !d.Admitted {
		s.host.LogVerdict(&d.Worst, false, d.Never, "door", "envoy_rls", "domain", domain)
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
