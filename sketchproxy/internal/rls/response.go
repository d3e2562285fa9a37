package rls

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// respond is the decision as Envoy reads it: one status per descriptor
// (ms holds one match per descriptor), the call's overall code, and the
// headers and metadata that envoy_rls asks for.
func respond(req *rlsv3.RateLimitRequest, ms []match, d *engine.Decision, rc *config.EnvoyRLSConfig, now time.Time) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ms))}
	for i := range ms {
		resp.Statuses[i] = descriptorStatus(&ms[i], d.Verdicts, now)
	}
	if !d.Admitted {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	switch rc.ResponseHeaders {
	case config.RLSHeadersDraft:
		if d.Fields.Any {
			resp.ResponseHeadersToAdd = draftHeaders(d)
		}
	case config.RLSHeadersRateLimit:
		resp.ResponseHeadersToAdd = limitHeaders(resp.Statuses)
	}
	if rc.ResponseDynamicMetadata {
		resp.DynamicMetadata = metadata(req, ms, d.Verdicts)
	}
	return resp
}

// descriptorStatus is one descriptor's status: OK without a limit; the maximum
// remaining for an unlimited one (as envoyproxy/ratelimit); else its
// verdict's code, limit, remaining and time until reset (none for a limit
// its hits can never fit: that would promise a pass). A descriptor over its
// limit reads OVER_LIMIT also under the global shadow_mode, as theirs
// (only the call's overall code is OK there); one in shadow_mode of its
// own, or a quota, reads OK.
func descriptorStatus(mt *match, vs []engine.Verdict, now time.Time) *rlsv3.RateLimitResponse_DescriptorStatus {
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
	if overLimit(v) {
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

// overLimit reports whether a verdict's descriptor status reads OVER_LIMIT:
// over its limit, not a quota (a quota over stays OK, as in
// envoyproxy/ratelimit), and not in a shadow_mode of its own. The global
// shadow_mode, which only turns the call's overall code OK, does not
// count.
func overLimit(v *engine.Verdict) bool {
	return v.Over && !v.Quota && !v.Rule.Shadow
}

// draftHeaders are the RateLimit-Policy and RateLimit fields, and
// Retry-After on a refusal that a wait can end (response_headers: draft).
func draftHeaders(d *engine.Decision) []*corev3.HeaderValue {
	hs := []*corev3.HeaderValue{{Key: "RateLimit-Policy", Value: d.Fields.Policy}}
	if len(d.Fields.RateLimit) > 0 {
		hs = append(hs, &corev3.HeaderValue{Key: "RateLimit", Value: string(d.Fields.RateLimit)})
	}
	if !d.Admitted && !d.Never {
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(rate.Seconds(d.Retry), 10)})
	}
	return hs
}

// limitHeaders are envoyproxy/ratelimit's headers (response_headers:
// ratelimit): RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of
// the most limiting descriptor, chosen as theirs chooses it: the last
// descriptor over its limit, or, with none over, the first with the least
// remaining (a quota or a shadow descriptor competes by its remaining
// only). Under the global shadow_mode they are sent as without it, as
// theirs. Reset is the seconds until its count leaves room (theirs: until
// the window's end), left out where none ever will.
func limitHeaders(sts []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
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

// metadata is the call as envoyproxy/ratelimit's dynamic metadata
// gives it (response_dynamic_metadata): its domain, its descriptors'
// entries as key=value, its hits, and which descriptors were over a quota.
func metadata(req *rlsv3.RateLimitRequest, ms []match, vs []engine.Verdict) *structpb.Struct {
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
