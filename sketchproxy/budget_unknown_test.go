package sketchproxy

import (
	"fmt"
	"testing"
)

// A request refused with 503 (its wallet cannot be tracked: a bucket full
// of bigger spenders, and the wallet fails closed) is not the client's
// doing: it counts against none of its rule's limits (refused: free). The
// limits were counted before the wallets were charged, and five such 503s
// left the client a 429 with a Retry-After of 1,000 s.
func TestBudgetUnknownNotCounted(t *testing.T) {
	h := newHarness(t, `sketch: {buckets: 1}
rules:
  - name: whales
    match: {path_prefix: /whale}
    key: ["header:X-Key"]
    budget: {name: b, units: 100000, per: 1d, cost: 1}
  - name: llm
    match: {path_prefix: /v1}
    key: ["header:X-Key"]
    limits: [{requests: 5, per: 1h}]
    budget: {name: b, units: 100000, per: 1d, cost: 1}
`)
	for k := range 8 {
		for range 5 {
			h.reqPath("/whale", "X-Key", fmt.Sprint("whale", k), "X-Test-Tokens", "900")
		}
	}
	codes := map[int]int{}
	for range 5 {
		codes[h.req("198.51.100.1", "X-Key", "newcomer").Code]++
	}
	st := h.mw.state.Load()
	ru := st.set.Rules[1]
	est := h.mw.eng.Estimate(ru, ru.Limits[0], "newcomer")
	t.Logf("answers %v; the newcomer's count in its 5-an-hour limit: %d", codes, est)
	if codes[503] > 0 && est > 0 {
		t.Errorf("%d requests refused with 503 were counted in the limit: %d of 5 used", codes[503], est)
	}
	if codes[503] == 0 {
		t.Fatalf("no 503: the wallet tracked the newcomer, so the test tests nothing (answers %v)", codes)
	}
}
