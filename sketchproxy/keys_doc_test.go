package sketchproxy

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// docs/rules-and-limits.md, Keys: a missing part is "-", so every client
// that sends no X-API-Key shares the one key "-" and its limit, and
// beside ip each address has its own "-|address". The page says so, and
// the proxy does so.
func TestMissingKeyPartSharesDash(t *testing.T) {
	page := docSection(t, filepath.Join("docs", "rules-and-limits.md"), "Rules")
	for _, claim := range []string{
		"A missing part is `-`: every client that sends no `X-API-Key` shares the one key `-` (or `-|203.0.113.7` beside `ip`), and so one limit",
		"| `jwt:CLAIM` | the claim CLAIM of the bearer token",
	} {
		if !strings.Contains(page, claim) {
			t.Errorf("docs/rules-and-limits.md, Rules, no longer says %q", claim)
		}
	}

	const limit = "    limits: [{requests: 2, per: 1m}]\n"
	shared := newHarness(t, "rules:\n  - key: [header:X-API-Key]\n"+limit)
	codes := func(h *harness, peer string, hdr ...string) string {
		return strconv.Itoa(h.req(peer, hdr...).Code)
	}
	got := []string{
		codes(shared, "203.0.113.1"), codes(shared, "203.0.113.2"), // two clients without the header
		codes(shared, "203.0.113.3"),                       // a third: the key "-" is spent
		codes(shared, "203.0.113.3", "X-API-Key", "alice"), // a key of its own
	}
	if want := []string{"200", "200", "429", "200"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("key [header:X-API-Key], clients without it: %v, want %v (one shared key -)", got, want)
	}

	apart := newHarness(t, "rules:\n  - key: [header:X-API-Key, ip]\n"+limit)
	got = []string{
		codes(apart, "203.0.113.1"), codes(apart, "203.0.113.1"), codes(apart, "203.0.113.1"),
		codes(apart, "203.0.113.2"),
	}
	if want := []string{"200", "200", "429", "200"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("key [header:X-API-Key, ip], clients without the header: %v, want %v (-|address apart)", got, want)
	}
}
