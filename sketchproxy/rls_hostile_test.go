package sketchproxy

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Each descriptor is judged on its own: a request whose other descriptors
// are oversized, malformed or too many is still refused by the per-client
// limit it is over, and, under that limit, is answered (never an error
// for the whole call, which Envoy would let through: failure_mode_deny is
// false by default).
func TestRLSEachDescriptorJudgedAlone(t *testing.T) {
	h := newRLSHarness(t, "", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: "/files/*"
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	many := make([]*rlv3.RateLimitDescriptor, 64)
	for i := range many {
		many[i] = entries("junk", fmt.Sprint(i))
	}
	deep := entries(strings.Split(strings.Repeat("k,v,", 17), ",")...)
	bad := []struct {
		name string
		ds   []*rlv3.RateLimitDescriptor
	}{
		{"a 5,000-byte value", []*rlv3.RateLimitDescriptor{entries("path", "/files/"+strings.Repeat("x", 5000))}},
		{"17 entries", []*rlv3.RateLimitDescriptor{deep}},
		{"65 descriptors", many},
		{"an empty entry key", []*rlv3.RateLimitDescriptor{entries("", "x")}},
	}
	for i, c := range bad {
		client := fmt.Sprintf("192.0.2.%d", i+1)
		ds := append(append([]*rlv3.RateLimitDescriptor(nil), c.ds...), entries("remote_address", client))
		for n := range 3 {
			if resp := h.ask(t, "edge", 0, ds...); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != len(ds) {
				t.Fatalf("%s: call %d of 3 under the limit: %v", c.name, n+1, resp)
			}
		}
		resp := h.ask(t, "edge", 0, ds...)
		last := resp.GetStatuses()[len(ds)-1]
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || last.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: the 4th call of a client limited to 3: %v, want OVER_LIMIT from its own descriptor", c.name, resp)
		}
	}
	// The oversized value is counted under a digest of it: the same value
	// is the same count, a value one byte longer another.
	long := "/files/" + strings.Repeat("y", 5000)
	for range 100 {
		h.ask(t, "edge", 0, entries("path", long))
	}
	if resp := h.ask(t, "edge", 0, entries("path", long)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the 101st call of one 5,000-byte value limited to 100: %v", resp.GetOverallCode())
	}
	if resp := h.ask(t, "edge", 0, entries("path", long+"y")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("another long value shares the first one's count: %v", resp.GetOverallCode())
	}
}

// rawCodec sends a message's bytes as they are, so that a test can send
// what no proto library would (invalid UTF-8 in a string field), and reads
// the answer as a proto message.
type rawCodec struct{}

type rawMsg []byte

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMsg))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

func (rawCodec) Name() string { return "proto" }

// A descriptor value that is not UTF-8 (proto3 refuses the whole message)
// is judged by its bytes, and the per-client limit beside it still refuses.
func TestRLSInvalidUTF8JudgedAlone(t *testing.T) {
	h := newRLSHarness(t, "", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	// A valid request, then its placeholder value replaced by invalid
	// UTF-8 bytes of the same length.
	valid, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{
		entries("user", "PLACEHOLDER"), entries("remote_address", "198.51.100.9"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	raw := rawMsg(bytes.Replace(valid, []byte("PLACEHOLDER"), []byte("\xff\xfe\xc0\x80ab\xed\xa0\x80xy"), 1))
	if proto.Unmarshal(raw, &rlsv3.RateLimitRequest{}) == nil {
		t.Fatal("the raw request is valid proto3: the test would test nothing")
	}
	call := func() *rlsv3.RateLimitResponse {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp := &rlsv3.RateLimitResponse{}
		if err := h.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &raw, resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
			t.Fatalf("a value that is not UTF-8 failed the whole call: %v", err)
		}
		return resp
	}
	// The user descriptor (2 a minute) refuses the third call, by the
	// value's own bytes; the client's (3) the fourth.
	for n := range 2 {
		if resp := call(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", n+1, resp)
		}
	}
	resp := call()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the 3rd call: %v, want the user descriptor (2 a minute) OVER_LIMIT", resp)
	}
	// The refused call counted nothing: the client has one call left,
	// then its own limit refuses beside the invalid value.
	if resp := h.ask(t, "edge", 0, entries("remote_address", "198.51.100.9")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("the client's 3rd counted call: %v", resp.GetOverallCode())
	}
	if resp := call(); resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the client over its 3 a minute, beside a value that is not UTF-8: %v", resp)
	}
}

// The headers Envoy adds for its client: none by default, as
// envoyproxy/ratelimit; its RateLimit-Limit, -Remaining and -Reset of the
// most limiting descriptor; or the draft's fields, whose policies are named
// by the limit's name or its unit, never by the descriptor's keys and
// values.
func TestRLSResponseHeaders(t *testing.T) {
	file := `domain: edge
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {name: per-client, unit: second, requests_per_unit: 3}
`
	ds := []*rlv3.RateLimitDescriptor{entries("source_cluster", "proxy", "destination_cluster", "bkthomps"), entries("remote_address", "192.0.2.1")}
	for _, c := range []struct {
		mode string
		want map[string]string // header: value ("" absent)
	}{
		{"", map[string]string{"RateLimit-Policy": "", "RateLimit": "", "RateLimit-Limit": ""}},
		{"ratelimit", map[string]string{"RateLimit-Limit": "3", "RateLimit-Remaining": "2", "RateLimit-Reset": "1", "RateLimit-Policy": ""}},
		{"draft", map[string]string{"RateLimit-Policy": `"per-minute";q=5;w=60, "per-client";q=3;w=1`, "RateLimit": `"per-minute";r=4;t=40, "per-client";r=2;t=1`, "RateLimit-Limit": ""}},
	} {
		extra := ""
		if c.mode != "" {
			extra = "  response_headers: " + c.mode + "\n"
		}
		h := newRLSHarness(t, extra, "edge.yaml", file)
		resp := h.ask(t, "edge", 0, ds...)
		for k, want := range c.want {
			if got := header(resp, k); got != want {
				t.Errorf("response_headers %q: %s %q, want %q", c.mode, k, got, want)
			}
		}
		for _, hv := range resp.GetResponseHeadersToAdd() {
			if strings.Contains(hv.GetValue(), "bkthomps") || strings.Contains(hv.GetValue(), "source_cluster") {
				t.Errorf("response_headers %q: %s names a descriptor: %q", c.mode, hv.GetKey(), hv.GetValue())
			}
		}
	}
	// Over the limit, ratelimit's headers describe the descriptor over it.
	h := newRLSHarness(t, "  response_headers: ratelimit\n", "edge.yaml", file)
	for range 3 {
		h.ask(t, "edge", 0, ds...)
	}
	resp := h.ask(t, "edge", 0, ds...)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || header(resp, "RateLimit-Limit") != "3" || header(resp, "RateLimit-Remaining") != "0" {
		t.Errorf("over the per-client limit: %v", resp)
	}
}

// The headers where several descriptors compete, as envoyproxy/ratelimit
// chooses: draft policies are unique in a response (two unnamed limits per
// minute are per-minute and per-minute-2, not one policy twice); ratelimit
// mode reports the last descriptor over its limit (theirs sets it at each
// one over); under the global shadow_mode the statuses still read
// OVER_LIMIT and both modes send their headers as without it (theirs sends
// its headers there), but no Retry-After: the call passes.
func TestRLSResponseHeadersAsTheirs(t *testing.T) {
	file := `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3}
`
	ds := []*rlv3.RateLimitDescriptor{entries("user", "ann"), entries("ip", "192.0.2.1")}
	h := newRLSHarness(t, "  response_headers: draft\n", "d.yaml", file)
	resp := h.ask(t, "d", 0, ds...)
	if p := header(resp, "RateLimit-Policy"); p != `"per-minute";q=2;w=60, "per-minute-2";q=3;w=60` {
		t.Errorf("two unnamed limits per minute: RateLimit-Policy %q, want per-minute and per-minute-2", p)
	}
	if rl := header(resp, "RateLimit"); rl != `"per-minute";r=1;t=40, "per-minute-2";r=2;t=39` {
		t.Errorf("RateLimit %q", rl)
	}

	// Both over: theirs reports the last one over.
	h = newRLSHarness(t, "  response_headers: ratelimit\n", "d.yaml", file)
	for range 3 {
		h.ask(t, "d", 0, ds...)
	}
	h.ask(t, "d", 0, ds[1]) // ip: 3 of 3, user: 2 of 2
	resp = h.ask(t, "d", 0, ds...)
	if resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("want both over: %v", resp)
	}
	if l, r := header(resp, "RateLimit-Limit"), header(resp, "RateLimit-Remaining"); l != "3" || r != "0" {
		t.Errorf("both over: RateLimit-Limit %s, -Remaining %s; want the last over's, 3 and 0", l, r)
	}

	// The global shadow_mode.
	for _, c := range []struct{ mode, want, value string }{
		{"ratelimit", "RateLimit-Remaining", "0"},
		{"draft", "RateLimit", `"per-minute";r=0;t=`},
	} {
		h := newRLSHarness(t, "  shadow_mode: true\n  response_headers: "+c.mode+"\n", "d.yaml", file)
		h.ask(t, "d", 0, ds[0])
		h.ask(t, "d", 0, ds[0])
		resp := h.ask(t, "d", 0, ds[0])
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("shadow_mode, %s: %v; want the call OK, its descriptor OVER_LIMIT", c.mode, resp)
		}
		if got := header(resp, c.want); !strings.HasPrefix(got, c.value) {
			t.Errorf("shadow_mode, %s: %s %q, want %q", c.mode, c.want, got, c.value)
		}
		if ra := header(resp, "Retry-After"); ra != "" {
			t.Errorf("shadow_mode, %s: Retry-After %s on a call that passes", c.mode, ra)
		}
	}
}

// envoy_rls.shadow_mode answers every call OK, counting and logging what
// it would have refused; refused: count counts every hit of a refused call,
// as envoyproxy/ratelimit does by default.
func TestRLSGlobalShadowAndCountedRefusals(t *testing.T) {
	file := `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	h := newRLSHarness(t, "  shadow_mode: true\n", "d.yaml", file)
	for i := range 5 {
		if resp := h.ask(t, "d", 0, entries("user", "ann")); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("shadow mode, call %d: %v", i+1, resp.GetOverallCode())
		}
	}
	var shadow uint64
	h.mw.Decisions(func(rule string, o Outcome, sh bool, n uint64) {
		if o == Reject && sh {
			shadow += n
		}
	})
	if shadow != 3 {
		t.Errorf("shadow mode: %d shadow refusals counted, want 3 (calls 3 to 5)", shadow)
	}

	// free (the default): refused calls cost nothing, so half a minute
	// later (one halving) a client that kept calling gets one back.
	for _, c := range []struct {
		refused string
		want    rlsv3.RateLimitResponse_Code
	}{{"free", rlsv3.RateLimitResponse_OK}, {"count", rlsv3.RateLimitResponse_OVER_LIMIT}} {
		h := newRLSHarness(t, "  refused: "+c.refused+"\n", "d.yaml", file)
		for range 10 {
			h.ask(t, "d", 0, entries("user", "bob"))
		}
		h.clk.Advance(30 * time.Second)
		if got := h.ask(t, "d", 0, entries("user", "bob")).GetOverallCode(); got != c.want {
			t.Errorf("refused: %s, 10 calls of a limit of 2, then half a minute: %v, want %v", c.refused, got, c.want)
		}
	}
}

// What an operator of envoyproxy/ratelimit watches: refused calls in the
// log (as the HTTP doors log theirs), near_limit per rule, and per-value
// series of detailed_metric descriptors. Their value label is the keyed
// hash of the descriptor's values as sent, joined with "|", which
// Config.KeyLabel (sketchproxy -key-label) computes under
// key_label_secret_file; the series are bounded over all descriptors
// together and keep the heaviest values, whenever they came: a client
// that arrives after a flood of one-off values still gets its own series
// (the first 99 values kept theirs for good, and it counted in "other").
// A reload drops the series of descriptors no longer configured.
func TestRLSObservability(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "label.key")
	os.WriteFile(secret, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
	file := `domain: api
descriptors:
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: path
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
  - key: plan
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
`
	var logs bytes.Buffer
	h := newRLSHarnessLog(t, slog.New(slog.NewTextHandler(&logs, nil)), "key_label_secret_file: "+secret+"\n", "api.yaml", file)
	h.mw.met.rls.Values.Max = 100 // the bound, lowered to see it work
	labels, err := ParseConfig("labels.yaml", []byte("key_label_secret_file: "+secret+"\nenvoy_rls: {listen: 127.0.0.1:0, domains: [{domain: d}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	label := func(key string) string {
		t.Helper()
		l, err := labels.KeyLabel(key)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	sent := map[string]float64{} // hits sent, by rule
	ask := func(rule string, d *rlv3.RateLimitDescriptor) {
		h.ask(t, "api", 0, d)
		sent[rule]++
	}
	const apiKey, path, plan = "envoy:api:api_key", "envoy:api:api_key:path", "envoy:api:plan"
	for i := range 100 {
		ask(apiKey, entries("api_key", fmt.Sprint("early-", i)))
	}
	for range 7 {
		ask(apiKey, entries("api_key", "alice"))
	}
	ask(path, entries("api_key", "bob", "path", "/v1/x"))
	ask(path, entries("api_key", "bob", "path", "/v1/x"))
	for i := range 200 {
		if i%2 == 0 {
			ask(apiKey, entries("api_key", fmt.Sprint("late-", i)))
		} else {
			ask(plan, entries("plan", fmt.Sprint("plan-", i)))
		}
	}
	fams := scrape(t, h.mw)
	alice, bob := label("alice"), label("bob|/v1/x")
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{"sketchproxy_envoy_rls_value_hits_total", `rule="` + apiKey + `",value="` + alice + `"`, 7},
		{"sketchproxy_envoy_rls_value_over_limit_total", `rule="` + apiKey + `",value="` + alice + `"`, 2},
		// 5 admitted calls leave 2, 4, 6, 8 and 10 counts of 10: the 5th
		// is above 80%.
		{"sketchproxy_envoy_rls_value_near_limit_total", `rule="` + apiKey + `",value="` + alice + `"`, 1},
		{"sketchproxy_decisions_near_limit_total", `rule="` + apiKey + `"`, 1},
		{"sketchproxy_envoy_rls_value_hits_total", `rule="` + path + `",value="` + bob + `"`, 2},
	} {
		if got, ok := metricValue(fams, c.name, c.labels); !ok || got != c.want {
			t.Errorf("%s{%s} = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	// Bounded over all descriptors; the values and other add up to every
	// hit of each descriptor.
	own := 0
	sums := map[string]float64{}
	for _, m := range fams["sketchproxy_envoy_rls_value_hits_total"].GetMetric() {
		var rule, value string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "rule":
				rule = l.GetValue()
			case "value":
				value = l.GetValue()
			}
		}
		if value != "other" {
			own++
		}
		sums[rule] += m.GetCounter().GetValue()
	}
	if own != 100 {
		t.Errorf("%d value series of 310 values, want the bound, 100", own)
	}
	for rule, n := range sent {
		if sums[rule] != n {
			t.Errorf("%s: its values and other add up to %v hits, want the %v sent", rule, sums[rule], n)
		}
	}
	line := logs.String()
	if !strings.Contains(line, "sketchproxy decision") || !strings.Contains(line, "door=envoy_rls") || !strings.Contains(line, "domain=api") || !strings.Contains(line, "key="+alice) {
		t.Errorf("no refusal logged as the HTTP doors log theirs, under -key-label's label %s:\n%s", alice, line)
	}
	if strings.Contains(line, "alice") {
		t.Errorf("a client's value reached the log:\n%s", line)
	}

	// A reload that renames plan (and drops path's detailed_metric)
	// drops their series; api_key's stay.
	main := filepath.Join(dir, "main.yaml")
	os.WriteFile(filepath.Join(dir, "api.yaml"), []byte(strings.Replace(strings.Replace(file, "key: plan", "key: tier", 1), "        detailed_metric: true\n", "", 1)), 0o644)
	os.WriteFile(main, []byte("admin: \"off\"\nkey_label_secret_file: "+secret+"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  files: [api.yaml]\n"), 0o644)
	if err := h.mw.ReloadFrom(func() (*Config, error) { return LoadConfig(main) }); err != nil {
		t.Fatal(err)
	}
	left := map[string]bool{}
	for _, m := range scrape(t, h.mw)["sketchproxy_envoy_rls_value_hits_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "rule" {
				left[l.GetValue()] = true
			}
		}
	}
	if left[plan] || left[path] || !left[apiKey] {
		t.Errorf("after the reload, series of %v; want %s's only", left, apiKey)
	}
}

// A refusal's log line says the wait the client is (or, in shadow mode,
// would have been) told: a shadow refusal's retry_after_s is what the
// enforced rule would have answered (it logged 1 s, the floor, where the
// wait was 30 s), and a limit no wait satisfies (requests_per_unit: 0)
// logs never, not 1 s.
func TestRLSRefusalLogWaits(t *testing.T) {
	var logs bytes.Buffer
	h := newRLSHarnessLog(t, slog.New(slog.NewTextHandler(&logs, nil)), "  response_headers: draft\n", "d.yaml", `domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: trial_blocked
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	var enforced *rlsv3.RateLimitResponse
	for range 3 {
		enforced = h.ask(t, "d", 0, entries("user", "ann"))
		h.ask(t, "d", 0, entries("trial", "ann"))
	}
	if enforced.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || header(enforced, "Retry-After") != "17" {
		t.Fatalf("the enforced rule's 3rd call: %v, want OVER_LIMIT with Retry-After 17 (5 counts to 3)", enforced)
	}
	h.ask(t, "d", 0, entries("blocked", "x"))
	h.ask(t, "d", 0, entries("trial_blocked", "x"))
	want := map[string]string{ // rule: its line's retry_after_s
		"envoy:d:user":          "17", // 5 counts of 5 decay to 3
		"envoy:d:trial":         "17", // as the enforced rule said
		"envoy:d:blocked":       "never",
		"envoy:d:trial_blocked": "never",
	}
	for rule, retry := range want {
		re := regexp.MustCompile(`msg="sketchproxy decision" rule=` + regexp.QuoteMeta(rule) + ` .*retry_after_s=(\S+)`)
		m := re.FindStringSubmatch(logs.String())
		if m == nil || m[1] != retry {
			t.Errorf("%s: logged retry_after_s %v, want %s\n%s", rule, m, retry, logs.String())
		}
	}
}

// sketchproxy_request_duration_seconds observes each ShouldRateLimit call
// once for each rule it matched, however many of its descriptors matched
// it (the series existed, never observed); a reload that renames a
// descriptor drops the old name's series.
func TestRLSRequestDuration(t *testing.T) {
	h := newRLSHarness(t, "", "d.yaml", rlsUserFile)
	h.ask(t, "d", 0, entries("user", "ann"))
	h.ask(t, "d", 0, entries("user", "ann"), entries("user", "bob"), entries("ip", "192.0.2.1"))
	h.ask(t, "d", 0, entries("path", "/")) // matches nothing
	const name = "sketchproxy_request_duration_seconds"
	fams := scrape(t, h.mw)
	for rule, want := range map[string]float64{"envoy:d:user": 2, "envoy:d:ip": 1} {
		if got, ok := metricValue(fams, name, `rule="`+rule+`"`); !ok || got != want {
			t.Errorf("%s{rule=%q}: %v observations (found %v), want %v", name, rule, got, ok, want)
		}
	}
	dir := t.TempDir()
	main := filepath.Join(dir, "main.yaml")
	os.WriteFile(filepath.Join(dir, "d.yaml"), []byte("domain: d\ndescriptors:\n  - key: account\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"), 0o644)
	os.WriteFile(main, []byte("admin: \"off\"\nenvoy_rls:\n  listen: \"127.0.0.1:0\"\n  files: [d.yaml]\n"), 0o644)
	if err := h.mw.ReloadFrom(func() (*Config, error) { return LoadConfig(main) }); err != nil {
		t.Fatal(err)
	}
	fams = scrape(t, h.mw)
	for _, rule := range []string{"envoy:d:user", "envoy:d:ip"} {
		if _, ok := metricValue(fams, name, `rule="`+rule+`"`); ok {
			t.Errorf("%s{rule=%q} outlived its descriptor's reload", name, rule)
		}
	}
}

// A descriptor Envoy sends twice in one call (a virtual host's and a
// route's rate_limits on remote_address) is one fact with both hits: they
// fit or not together, a refused call counts neither, and waiting its
// Retry-After is enough. Apart, the first was counted and the second
// refused, and a client at 2 hits a minute under 3 a minute starved.
func TestRLSDuplicateDescriptorIsOneFact(t *testing.T) {
	h := newRLSHarness(t, "  response_headers: draft\n", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`)
	d := entries("remote_address", "203.0.113.7")
	h.ask(t, "edge", 0, d)
	h.ask(t, "edge", 0, d)
	resp := h.ask(t, "edge", 0, d, d) // 2 hits, 1 left
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("2 hits with 1 left: %v", resp.GetOverallCode())
	}
	if r := h.ask(t, "edge", 0, d); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("the refused (d, d) counted a hit: the one left is gone")
	}
	h2 := newRLSHarness(t, "", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
`)
	ok := 0
	for range 30 {
		if h2.ask(t, "edge", 0, d, d).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
		h2.clk.Advance(time.Minute)
	}
	if ok != 30 {
		t.Errorf("2 hits a minute (the descriptor twice) under 3 a minute: %d of 30 calls admitted", ok)
	}
}

// A call up to gRPC's default 4 MiB is answered, as envoyproxy/ratelimit
// answers one of 2.1 MB (the cap was 1 MiB: such a call failed, and Envoy
// let the request through); a larger one is refused by gRPC before it is
// read (ResourceExhausted).
func TestRLSLargeCall(t *testing.T) {
	h := newRLSHarness(t, "", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	call := func(n int) (*rlsv3.RateLimitResponse, error) {
		ds := make([]*rlv3.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = entries("remote_address", fmt.Sprintf("%0120d", i))
		}
		ds[n-1] = entries("remote_address", "203.0.113.7")
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds}
		t.Logf("%d descriptors: %d bytes", n, proto.Size(req))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return h.client.ShouldRateLimit(ctx, req)
	}
	h.ask(t, "edge", 0, entries("remote_address", "203.0.113.7")) // its 1 a minute spent
	resp, err := call(15000)                                      // about 2.1 MB
	if err != nil {
		t.Fatalf("a 2.1 MB call: %v", err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.GetStatuses()) != 15000 {
		t.Errorf("a 2.1 MB call: %v, %d statuses; want OVER_LIMIT (its last descriptor is over)", resp.GetOverallCode(), len(resp.GetStatuses()))
	}
	if _, err := call(32000); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 4.5 MB call: %v, want ResourceExhausted", err)
	}
}

// A call of many descriptors costs what they cost (the fields are built
// in one pass), and each policy is listed once, with its most constrained
// value's item: 16,000 values of one descriptor make one policy, not
// 16,000 (which took 4 s and 1.4 MB of headers).
func TestRLSManyDescriptorsOnePolicy(t *testing.T) {
	h := newRLSHarness(t, "  response_headers: draft\n", "edge.yaml", `domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	ds := make([]*rlv3.RateLimitDescriptor, 16000)
	for i := range ds {
		ds[i] = entries("remote_address", fmt.Sprint(i))
	}
	h.ask(t, "edge", 0, ds[5]) // one value used once: the most constrained
	resp := h.ask(t, "edge", 0, ds...)
	if p, rl := header(resp, "RateLimit-Policy"), header(resp, "RateLimit"); p != `"per-minute";q=100;w=60` || rl != `"per-minute";r=98;t=18` {
		t.Errorf("RateLimit-Policy %q, RateLimit %q; want one policy, its most constrained value's item", p, rl)
	}
}
