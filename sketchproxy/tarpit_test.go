package sketchproxy

import "testing"

// With the default ladder a tarpitted key reaches the upstream up to 1.5
// times its limit, as docs/rules-and-limits.md (Tarpitting) and the
// tarpit section's doc say: 10 requests allowed, 5 delayed and then
// proxied, the rest refused without reaching it. drip_above is that 1.5.
func TestTarpitProxiesUpToDripAbove(t *testing.T) {
	h := newHarness(t, "rules:\n  - tarpit: true\n    limits: [{requests: 10, per: 10s}]\n")
	if d := h.mw.state.Load().cfg.Tarpit.DripAbove; d != 1.5 {
		t.Fatalf("the default drip_above is %g, not the 1.5 the docs state", d)
	}
	refused := 0
	for range 40 {
		if h.req("203.0.113.9").Code == 429 {
			refused++
		}
	}
	if refused != 25 || h.upstream.Load() != 15 {
		t.Errorf("40 requests at once at a limit of 10: %d refused, %d reached the upstream; want 25 and 15", refused, h.upstream.Load())
	}
}
