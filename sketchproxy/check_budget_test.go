package sketchproxy

import (
	"fmt"
	"net/http/httptest"
	"testing"
)

// The same untracked wallet: the proxy answers 503 (not the client's
// doing), and so does the forward-auth check with its default
// refusal_status, 429 (with 401 or 403 for nginx, every refusal takes that
// status and SketchProxy-Status says 503).
func TestCheckBudgetUnknownIs503(t *testing.T) {
	h := newHarness(t, `sketch: {buckets: 1}
client_ip: {trusted_proxies: [127.0.0.1/32]}
forward_auth: {gateway: caddy}
rules:
  - name: llm
    key: ["header:X-Key"]
    budget: {units: 100000, per: 1d, cost: 1}
`)
	for k := range 8 {
		for range 20 {
			h.req("198.51.100.1", "X-Key", fmt.Sprint("whale", k), "X-Test-Tokens", "900")
		}
	}
	proxy := h.req("198.51.100.1", "X-Key", "newcomer")
	r := httptest.NewRequest("GET", "http://api.test/check", nil)
	r.RemoteAddr = "127.0.0.1:5555"
	r.Header.Set("X-Forwarded-For", "198.51.100.1")
	r.Header.Set("X-Forwarded-Method", "GET")
	r.Header.Set("X-Forwarded-Uri", "/v1/x")
	r.Header.Set("X-Key", "newcomer")
	check := h.do(r)
	t.Logf("proxy %d %s; check %d %s", proxy.Code, proxy.Header().Get("Retry-After"), check.Code, check.Body.String())
	if proxy.Code != 503 || proxy.Code != check.Code {
		t.Errorf("the same untracked wallet: proxy %d, forward-auth check %d", proxy.Code, check.Code)
	}
}
