package sketchproxy

import (
	"math"
	"slices"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/rls"
)

// Envoy's descriptors count their hits beside their calls, as
// envoyproxy/ratelimit's total_hits, over_limit and within_limit do: a
// call of hits_addend 3 is 3 hits and one decision (decisions_total
// counted it 1 and nothing counted 3). A descriptor's own hits_addend
// overrides the request's; 0 there adds none, 0 on the request means 1.
func TestRLSHitsCounted(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile) // user: 10 a minute
	ann := entries("user", "ann")
	h.ask(t, "d", 0, ann) // 1 hit
	h.ask(t, "d", 3, ann) // 3: 4 of 10
	seven := entries("user", "ann")
	seven.HitsAddend = wrapperspb.UInt64(7)
	if r := h.ask(t, "d", 0, seven); r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT { // 11 of 10
		t.Fatalf("7 hits with 6 left: %v", r.GetOverallCode())
	}
	zero := entries("user", "ann")
	zero.HitsAddend = wrapperspb.UInt64(0)
	h.ask(t, "d", 5, zero) // judged, counts nothing
	fams := scrape(t, h.mw)
	for _, c := range []struct {
		name, outcome string
		want          float64
	}{
		{"sketchproxy_envoy_rls_hits_total", "allow", 1 + 3 + 0},
		{"sketchproxy_envoy_rls_hits_total", "reject", 7},
		{"sketchproxy_decisions_total", "allow", 3},
		{"sketchproxy_decisions_total", "reject", 1},
	} {
		labels := `outcome="` + c.outcome + `",rule="envoy:d:user",shadow="false"`
		if got, ok := metricValue(fams, c.name, labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (found %v), want %v", c.name, labels, got, ok, c.want)
		}
	}
	if got, ok := metricValue(fams, "sketchproxy_envoy_rls_requests_total", ""); got != 4 {
		t.Errorf("sketchproxy_envoy_rls_requests_total = %v (found %v), want the 4 calls", got, ok)
	}
	for _, f := range fams["sketchproxy_envoy_rls_hits_total"].GetMetric() {
		for _, l := range f.GetLabel() {
			if l.GetName() == "rule" && !rls.IsRule(l.GetValue()) {
				t.Errorf("sketchproxy_envoy_rls_hits_total has a series of the HTTP rule %q", l.GetValue())
			}
		}
	}
}

// The latency histogram's buckets start at 10 µs, where a call of Envoy's
// service (about 50 µs) can be told from a slow one: the first bound was
// 0.5 ms, and every call fell in it. They still reach past 16 s, the last
// bound until then.
func TestLatencyBuckets(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	h.ask(t, "d", 0, entries("user", "ann"))
	f := scrape(t, h.mw)["sketchproxy_request_duration_seconds"]
	if f == nil || len(f.GetMetric()) == 0 {
		t.Fatal("no sketchproxy_request_duration_seconds series after a call")
	}
	var bounds []float64 // as Prometheus's parser reads them: +Inf last
	for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	want := []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, math.Inf(1)}
	if !slices.Equal(bounds, want) {
		t.Errorf("buckets %v, want %v", bounds, want)
	}
}
