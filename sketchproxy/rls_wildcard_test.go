package sketchproxy

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// envoyproxy/ratelimit treats only a trailing * as a wildcard
// (config_impl.go: wildcardKeys holds keys ending in "*"; its own
// test/config/wildcard.yaml says "Wildcard in the middle of value is not
// supported"). docs/envoy.md's table says SketchProxy does "the same".
func TestRLSMidValueStarIsLiteral(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", `domain: d
descriptors:
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	for i := range 3 {
		if r := h.ask(t, "d", 0, entries("midWild", "barXb")); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("call %d: barXb matched bar*b (%v); envoyproxy/ratelimit applies no limit", i+1, r)
		}
	}
}

// share_threshold needs a value ending in * there: a*b is a config error.
func TestRLSShareThresholdNeedsTrailingStar(t *testing.T) {
	c, err := ParseConfig("t.yaml", []byte(`envoy_rls:
  listen: "127.0.0.1:0"
  domains:
    - domain: d
      descriptors:
        - key: k
          value: "a*b"
          share_threshold: true
          rate_limit: {unit: minute, requests_per_unit: 1}
`))
	if err == nil {
		err = c.Validate()
	}
	if err == nil {
		t.Fatal("share_threshold on a*b loaded; envoyproxy/ratelimit refuses it (values ending with '*' only)")
	}
}
