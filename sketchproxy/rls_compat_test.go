package sketchproxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/rate"
)

// The tests behind docs/envoy.md's "Moving from envoyproxy/ratelimit" table:
// each drives the real gRPC service, on a manual clock, with a config in
// envoyproxy/ratelimit's file format.

// rlsHarness is Envoy's rate-limit service of one Middleware, served on a
// free port, and a client of it.
type rlsHarness struct {
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
	clk    *epochsketch.ManualClock
	mw     *Middleware
}

// rlsT0 is a whole minute (ticks are anchored on the Unix epoch), so that
// a test knows where the next halving is.
var rlsT0 = time.Unix(1_800_000_000, 0)

// newRLSHarness serves envoy_rls with the domain files given (name: body),
// listed in files: in that order, and extra lines under envoy_rls.
func newRLSHarness(t *testing.T, extra string, files ...string) *rlsHarness {
	t.Helper()
	return newRLSHarnessLog(t, slog.New(slog.NewTextHandler(io.Discard, nil)), extra, files...)
}

// newRLSHarnessLog is newRLSHarness logging to log.
func newRLSHarnessLog(t *testing.T, log *slog.Logger, extra string, files ...string) *rlsHarness {
	t.Helper()
	dir := t.TempDir()
	var names []string
	for i := 0; i+1 < len(files); i += 2 {
		names = append(names, files[i])
		if err := os.WriteFile(filepath.Join(dir, files[i]), []byte(files[i+1]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	main := filepath.Join(dir, "main.yaml")
	body := "admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  files: [" + strings.Join(names, ", ") + "]\n" + extra
	if err := os.WriteFile(main, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(main)
	if err != nil {
		t.Fatal(err)
	}
	clk := epochsketch.NewManualClock(rlsT0)
	mw, err := New(cfg, http.NotFoundHandler(), Options{Clock: clk, Seed: 1, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(RateLimitServerOptions()...)
	mw.RegisterRateLimitService(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		srv.Stop()
		mw.Close()
	})
	return &rlsHarness{client: rlsv3.NewRateLimitServiceClient(conn), conn: conn, clk: clk, mw: mw}
}

// ask sends one request of descriptors to domain with hits hits (0: the
// default 1).
func (h *rlsHarness) ask(t *testing.T, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// passes counts how many of n requests of one descriptor are OK.
func (h *rlsHarness) passes(t *testing.T, n int, domain string, d *rlv3.RateLimitDescriptor) int {
	t.Helper()
	ok := 0
	for range n {
		if h.ask(t, domain, 0, d).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

func entries(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue()
		}
	}
	return ""
}

const rlsUserFile = `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// The window decays instead of resetting: 10 a minute halves the count
// every 40.3 s, smoothly, so after a full burst (21 counts of the 21 the
// limit holds), 30 s decays it to 12.6: room for 4, not 10 (and a client
// at a steady 10 a minute is never refused: package rate). Refused hits
// are free: hammering while refused costs nothing later.
func TestRLSDecayingWindowAndFreeRefusals(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	ann, bob := entries("user", "ann"), entries("user", "bob")
	if got := h.passes(t, 11, "d", ann); got != 10 {
		t.Fatalf("a quiet user's burst: %d of 11 passed, want 10", got)
	}
	if got := h.passes(t, 11, "d", bob); got != 10 {
		t.Fatalf("another user's burst: %d of 11 passed, want 10", got)
	}
	h.passes(t, 100, "d", bob) // bob hammers while refused
	h.clk.Advance(30 * time.Second)
	if got := h.passes(t, 10, "d", ann); got != 4 {
		t.Errorf("30 s after a burst of 10: %d passed, want 4 (the count decayed from 21 to 12.6)", got)
	}
	if got := h.passes(t, 10, "d", bob); got != 4 {
		t.Errorf("after 100 refused calls: %d passed, want 4, as for a user who waited", got)
	}
}

// A request refused for one descriptor counts the hits of none: the
// passing descriptor's remaining is what it was.
func TestRLSRefusedRequestCountsNothing(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	h.passes(t, 10, "d", entries("user", "ann"))
	ip := entries("ip", "192.0.2.1")
	resp := h.ask(t, "d", 0, entries("user", "ann"), ip)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ann over, the address not: %v", resp)
	}
	if r := h.ask(t, "d", 0, ip).GetStatuses()[0].GetLimitRemaining(); r != 9 {
		t.Errorf("the address after the refused request and one of its own: remaining %d, want 9", r)
	}
}

// With refused: count, a refused call counts every descriptor's hits, each
// on its own, as envoyproxy/ratelimit does: the one over its limit and the
// one that fit (refused: free counts neither: TestRLSRefusedRequestCountsNothing).
func TestRLSRefusedCallCountsEveryDescriptor(t *testing.T) {
	h := newRLSHarness(t, "  refused: count\n", "d.yaml", rlsUserFile)
	h.passes(t, 10, "d", entries("user", "ann"))
	ip := entries("ip", "192.0.2.1")
	resp := h.ask(t, "d", 0, entries("user", "ann"), ip)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ann over, the address not: %v", resp)
	}
	if r := resp.GetStatuses()[1].GetLimitRemaining(); r != 9 {
		t.Errorf("the address in the refused call: remaining %d, want 9 (its hit counted)", r)
	}
	if r := h.ask(t, "d", 0, ip).GetStatuses()[0].GetLimitRemaining(); r != 8 {
		t.Errorf("the address after the refused call and one of its own: remaining %d, want 8", r)
	}
	// ann's refused hit was counted too: half a minute halves her 11 hits
	// to 5.5, so 4 more fit, not the 5 that 10 halved would leave.
	h.clk.Advance(30 * time.Second)
	if got := h.passes(t, 10, "d", entries("user", "ann")); got != 4 {
		t.Errorf("ann half a minute after 11 calls: %d passed, want 4", got)
	}
}

// More hits than the whole limit can never pass: OVER_LIMIT with no
// duration_until_reset, no Retry-After and no RateLimit item (whose t
// would promise a time), while a request that fits later is told when.
func TestRLSHitsOverTheWholeLimit(t *testing.T) {
	h := newRLSHarness(t, "  response_headers: draft\n", "d.yaml", rlsUserFile)
	resp := h.ask(t, "d", 11, entries("user", "ann"))
	st := resp.GetStatuses()[0]
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetLimitRemaining() != 0 || st.GetDurationUntilReset() != nil {
		t.Errorf("11 hits of 10: %v", resp)
	}
	if ra := header(resp, "Retry-After"); ra != "" {
		t.Errorf("11 hits of 10: Retry-After %s promises a pass", ra)
	}
	if rl, pol := header(resp, "RateLimit"), header(resp, "RateLimit-Policy"); rl != "" || pol == "" {
		t.Errorf("11 hits of 10: RateLimit %q (want none), RateLimit-Policy %q (want the policy)", rl, pol)
	}
	// Beside a descriptor that would pass later, still no Retry-After.
	h.passes(t, 10, "d", entries("ip", "192.0.2.9"))
	both := h.ask(t, "d", 0, entries("ip", "192.0.2.9"), &rlv3.RateLimitDescriptor{Entries: entries("user", "ann").Entries, HitsAddend: wrapperspb.UInt64(11)})
	if header(both, "Retry-After") != "" || both.GetStatuses()[0].GetDurationUntilReset() == nil {
		t.Errorf("one over for now, one never: %v", both)
	}
	// 10 hits fit a quiet user, and 5 more are told to wait until their
	// count (21) has decayed to 11: about a tick (40.3 s), told to the
	// nanosecond, and Retry-After in whole seconds, rounded up.
	if resp := h.ask(t, "d", 10, entries("user", "ann")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("10 hits of 10: %v", resp)
	}
	resp = h.ask(t, "d", 5, entries("user", "ann"))
	if d := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || d < 30*time.Second || d > 41*time.Second || header(resp, "Retry-After") != fmt.Sprint(rate.Seconds(d)) {
		t.Errorf("5 more hits: %v, want OVER_LIMIT for 30 to 41 s, Retry-After the same rounded up", resp)
	}
}

// An unlimited descriptor, one that matches nothing, one with no entries,
// and a domain not configured are OK; the unlimited one reports
// limit_remaining 4294967295, as envoyproxy/ratelimit does.
func TestRLSUnlimitedAndNoLimit(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", `domain: d
descriptors:
  - key: user
    value: admin
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	resp := h.ask(t, "d", 0, entries("user", "admin"), entries("path", "/"), &rlv3.RateLimitDescriptor{}, entries("user", "ann"))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%v", resp)
	}
	s := resp.GetStatuses()
	if s[0].GetLimitRemaining() != math.MaxUint32 || s[0].GetCurrentLimit() != nil {
		t.Errorf("unlimited: %v", s[0])
	}
	for i, name := range []string{"no match", "no entries"} {
		if st := s[i+1]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil || st.GetLimitRemaining() != 0 {
			t.Errorf("%s: %v", name, st)
		}
	}
	if s[3].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Errorf("the limited descriptor beside them: %v", s[3])
	}
	for range 5 {
		if resp := h.ask(t, "d", 0, entries("user", "admin")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("unlimited, again: %v", resp)
		}
	}
	if resp := h.ask(t, "other", 0, entries("user", "ann")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
		t.Errorf("a domain not configured: %v", resp)
	}
}

// requests_per_unit: 0 refuses every request that adds hits; one that
// adds none (hits_addend 0) is OK with nothing remaining.
func TestRLSZeroBlocksAll(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", `domain: d
descriptors:
  - key: path
    value: /admin
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /trial
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
`)
	for i := range 3 {
		resp := h.ask(t, "d", 0, entries("path", "/admin"))
		st := resp.GetStatuses()[0]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit().GetRequestsPerUnit() != 0 ||
			st.GetDurationUntilReset() != nil || header(resp, "Retry-After") != "" {
			t.Fatalf("call %d: %v", i+1, resp)
		}
		h.clk.Advance(time.Hour)
	}
	d := entries("path", "/admin")
	d.HitsAddend = wrapperspb.UInt64(0)
	if resp := h.ask(t, "d", 0, d); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 0 {
		t.Errorf("a look without hits: %v", resp)
	}
	if resp := h.ask(t, "d", 0, entries("path", "/trial")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("shadow mode: %v", resp)
	}
}

// Only a trailing * is a wildcard, as in envoyproxy/ratelimit (its
// wildcardKeys; its test/config/wildcard.yaml: "Wildcard in the middle of
// value is not supported"): /v1/* matches every value under /v1/, each
// counted apart; a * elsewhere is a literal byte; wildcards are tried in
// the order given, after exact values. With share_threshold every matching
// value shares one count, also when the limit sits deeper.
func TestRLSWildcards(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", `domain: d
descriptors:
  - key: path
    value: /v1/*/report
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /v1/admin
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: path
    value: /v1/*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /v1/a*
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /api/*
    share_threshold: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	for _, c := range []struct {
		value string
		limit uint32
	}{
		{"/v1/*/report", 3},   // the literal value: exact
		{"/v1/admin", 4},      // exact before any wildcard
		{"/v1/a/report", 2},   // not /v1/*/report (a literal *): /v1/*, the first wildcard given
		{"/v1/abc", 2},        // /v1/* before /v1/a*: the order given
		{"/v1/", 2},           // the * may stand for nothing
		{"/v1", 100},          // shorter than the prefix
		{"/files/", 2},        // share_threshold's wildcard
		{"/file", 100},        // no wildcard: the key without a value
		{"/v2/x/report", 100}, // no * in the middle either
	} {
		if got := h.ask(t, "d", 0, entries("path", c.value)).GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != c.limit {
			t.Errorf("%s: limit %d, want %d", c.value, got, c.limit)
		}
	}
	// /v1/a/report has 1 of its 2 left; /v1/b its own 2.
	if got := h.passes(t, 3, "d", entries("path", "/v1/b")); got != 2 {
		t.Errorf("another value of a wildcard without share_threshold: %d of 3 passed, want its own 2", got)
	}
	// /files/ took 1 of the shared 2.
	if got := h.passes(t, 1, "d", entries("path", "/files/a.pdf")); got != 1 {
		t.Errorf("/files/a.pdf: refused")
	}
	if got := h.passes(t, 1, "d", entries("path", "/files/b.csv")); got != 0 {
		t.Errorf("/files/b.csv after 2 others under a shared threshold: passed")
	}
	h.passes(t, 2, "d", entries("path", "/api/x", "method", "GET"))
	if got := h.passes(t, 1, "d", entries("path", "/api/y", "method", "GET")); got != 0 {
		t.Errorf("/api/y GET shares /api/x GET's count: passed")
	}
	if got := h.passes(t, 1, "d", entries("path", "/api/y", "method", "POST")); got != 1 {
		t.Errorf("/api/y POST: another method, its own count: refused")
	}
}

// A limit replaces another by name: when both match, the replaced one is
// neither applied nor counted.
func TestRLSReplaces(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", `domain: d
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: minute, requests_per_unit: 2}
  - key: plan
    value: gold
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces: [{name: per_user}]
`)
	gold := entries("plan", "gold")
	for i := range 5 {
		resp := h.ask(t, "d", 0, entries("user", "ann"), gold)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("gold call %d: %v", i+1, resp)
		}
	}
	if resp := h.ask(t, "d", 0, entries("user", "ann"), gold); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the 6th gold call: %v", resp)
	}
	// Alone, ann's own limit applies, and the gold calls did not count on it.
	if got := h.passes(t, 3, "d", entries("user", "ann")); got != 2 {
		t.Errorf("ann alone: %d of 3 passed, want 2", got)
	}
}

// Files of one domain merge with merge_domains, as with
// envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG.
func TestRLSMergeDomains(t *testing.T) {
	a := "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"
	b := "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 4}\n"
	h := newRLSHarness(t, "  merge_domains: true\n", "a.yaml", a, "b.yaml", b)
	resp := h.ask(t, "d", 0, entries("user", "ann"), entries("ip", "192.0.2.1"))
	if s := resp.GetStatuses(); s[0].GetCurrentLimit().GetRequestsPerUnit() != 3 || s[1].GetCurrentLimit().GetRequestsPerUnit() != 4 {
		t.Errorf("merged: %v", resp)
	}
}

// A descriptor's limit override is not applied: the files decide.
func TestRLSLimitOverrideIgnored(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	d := entries("user", "ann")
	d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1} // 1 a second
	if got := h.passes(t, 3, "d", d); got != 3 {
		t.Errorf("an override of 1 a second: %d of 3 passed, want 3 (the file's 10 a minute)", got)
	}
}

// Negative hits are answered OK and not counted (a sketch cannot give
// counts back).
func TestRLSNegativeHits(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	h.passes(t, 10, "d", entries("user", "ann"))
	d := entries("user", "ann")
	d.IsNegativeHits = true
	if resp := h.ask(t, "d", 3, d); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("negative hits: %v", resp)
	}
	if got := h.passes(t, 1, "d", entries("user", "ann")); got != 0 {
		t.Errorf("after negative hits, the 11th: passed; nothing is given back")
	}
}

// quota_mode: the request is over only if every quota descriptor is (or an
// ordinary one); a quota it is over reads OVER_LIMIT and is not charged.
func TestRLSQuotaMode(t *testing.T) {
	h := newRLSHarness(t, "  response_dynamic_metadata: true\n", "d.yaml", `domain: d
descriptors:
  - key: daily
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
`)
	req := []*rlv3.RateLimitDescriptor{entries("daily", "ann"), entries("user", "ann")}
	for i := range 4 {
		resp := h.ask(t, "d", 0, req...)
		daily := resp.GetStatuses()[0]
		// A quota over its limit never refuses: its status stays OK, with
		// its limit and nothing remaining, and the call's metadata names it.
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || daily.GetCode() != rlsv3.RateLimitResponse_OK || daily.GetCurrentLimit().GetRequestsPerUnit() != 2 {
			t.Fatalf("call %d: %v", i+1, resp)
		}
		md := resp.GetDynamicMetadata().GetFields()
		violations := md["quotaModeViolations"].GetListValue().GetValues()
		if over := i >= 2; over != (len(violations) == 1 && violations[0].GetNumberValue() == 0) || !md["quotaModeEnabled"].GetBoolValue() {
			t.Errorf("call %d: quota violations %v, quotaModeEnabled %v; want descriptor 0 from the 3rd call", i+1, violations, md["quotaModeEnabled"])
		}
		if i >= 2 && daily.GetLimitRemaining() != 0 {
			t.Errorf("call %d: the spent quota says %d remaining", i+1, daily.GetLimitRemaining())
		}
	}
	// Every hit counted, as envoyproxy/ratelimit counts them: the ordinary
	// limit saw four calls.
	if r := h.ask(t, "d", 0, entries("user", "ann")).GetStatuses()[0].GetLimitRemaining(); r != 95 {
		t.Errorf("the ordinary limit: remaining %d, want 95 (four calls and this one)", r)
	}
}

// The new-key defence changes decisions envoyproxy/ratelimit would make:
// after a spike of new values (150 in a second), a client first seen
// during it gets budget_factor of its limit, and at 2 a minute its 2nd
// call is refused. new_keys: {disabled: true} gives their decisions back:
// every client its whole limit, whatever others do.
func TestRLSNewKeysDisabledGivesTheirDecisions(t *testing.T) {
	file := `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	run := func(newKeys string) []rlsv3.RateLimitResponse_Code {
		h := newRLSHarness(t, "new_keys: "+newKeys+"\n", "d.yaml", file)
		for i := range 150 {
			h.ask(t, "d", 0, entries("user", fmt.Sprint("rotating-", i)))
			h.clk.Advance(time.Second / 150)
		}
		var got []rlsv3.RateLimitResponse_Code
		for range 3 {
			got = append(got, h.ask(t, "d", 0, entries("user", "ann")).GetOverallCode())
		}
		return got
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	// The defence on (warm-up skipped, as after a minute of running).
	if got := run("{warmup: 0s}"); got[0] != ok || got[1] != over {
		t.Fatalf("the defence on, a client first seen in a spike: %v, want its 2nd call refused (it gets a quarter of 2)", got)
	}
	if got := run("{disabled: true, warmup: 0s}"); got[0] != ok || got[1] != ok || got[2] != over {
		t.Errorf("new_keys disabled: %v, want OK OK OVER_LIMIT, as envoyproxy/ratelimit decides", got)
	}
}

// Every row of docs/envoy.md's "Moving from envoyproxy/ratelimit" table names
// at least one test, and each test it names exists (in this package or,
// where the row says so, in cmd/sketchproxy): a row whose test was renamed
// or never written is a claim nothing holds.
func TestMigrationTableNamesRealTests(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("docs", "envoy.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(page), "## Moving from envoyproxy/ratelimit\n")
	if !ok {
		t.Fatal("docs/envoy.md has no Moving from envoyproxy/ratelimit section")
	}
	table, _, _ = strings.Cut(table, "\n#")
	defined := map[string]bool{}
	for _, glob := range []string{"*_test.go", filepath.Join("cmd", "sketchproxy", "*_test.go")} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range regexp.MustCompile(`(?m)^func (Test\w+)\(`).FindAllStringSubmatch(string(b), -1) {
				defined[m[1]] = true
			}
		}
	}
	rows := 0
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| Behaviour ") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		names := regexp.MustCompile(`\bTest\w+`).FindAllString(cells[len(cells)-1], -1)
		if len(names) == 0 {
			t.Errorf("row %q names no test", cells[0])
		}
		for _, n := range names {
			if !defined[n] {
				t.Errorf("row %q names %s, which does not exist", cells[0], n)
			}
		}
	}
	if rows < 20 {
		t.Errorf("%d rows read: the table's shape changed", rows)
	}
}
