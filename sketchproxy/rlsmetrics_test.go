package sketchproxy

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
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
			if l.GetName() == "rule" && !isRLSRule(l.GetValue()) {
				t.Errorf("sketchproxy_envoy_rls_hits_total has a series of the HTTP rule %q", l.GetValue())
			}
		}
	}
}
