package sketchproxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestExampleAndDemoConfigsAreValid(t *testing.T) {
	for name, src := range map[string]string{"example": ExampleConfig, "minimal": MinimalConfig, "demo": DemoConfig} {
		c, err := ParseConfig(name, []byte(src))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(c.Rules) == 0 {
			t.Fatalf("%s: no rules", name)
		}
	}
	c, _ := ParseConfig("example", []byte(ExampleConfig))
	if got := c.Rules[0].Limits[1]; time.Duration(got.Per) != 24*time.Hour || got.Burst != got.Requests {
		t.Errorf("per: 1d and the default burst: %+v", got)
	}
	if c.Rules[1].Budget.Cost != 500 || c.Rules[1].Budget.ReconcileHeader != "X-Tokens-Used" {
		t.Errorf("budget: %+v", c.Rules[1].Budget)
	}
}

// Every bad config names the file, the line and the field, and says what
// to write instead.
func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name, src, want string
	}{
		{"empty", "", "p.yaml: the file is empty"},
		{"syntax", "rules:\n  - name: a\n   key: [ip]\n", "p.yaml:3: did not find expected"},
		{"tab", "listen: \":1\"\nrules:\n  - name: a\n\tlimits: []\n", "p.yaml:4: found a tab character"},
		{"bad indent", "rules:\n  - name: a\n    limits:\n      - requests: 5\n       per: 1s\n", "p.yaml:5: did not find expected"},
		{"unknown field", "rules:\n  - name: a\n    limts:\n      - {requests: 1, per: 1s}\n", `p.yaml:3: unknown field "limts"`},
		{"bad duration", "rules:\n  - name: a\n    limits:\n      - {requests: 1, per: 1 week}\n", `p.yaml:4: rules[0].limits[0].per: duration "1 week": want e.g. 1s, 10m, 24h or 1d`},
		{"bad type", "rules:\n  - name: a\n    limits:\n      - {requests: many, per: 1s}\n", `p.yaml:4: rules[0].limits[0].requests: a str "many" where a float64 belongs`},
		{"no rules", "listen: \":1\"\n", "p.yaml:1: rules: no rules"},
		{"no per", "rules:\n  - name: a\n    limits:\n      - {requests: 5}\n", "p.yaml:4: rules[0].limits[0]: per is missing"},
		{"listen", "listen: nonsense\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:1: listen: "nonsense": want host:port`},
		{"listen port", "listen: \":http-alt-x\"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:1: listen: ":http-alt-x": want host:port`},
		{"admin", "admin: 127.0.0.1\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:1: admin: "127.0.0.1": want host:port, e.g. ":8080" or "127.0.0.1:9091", or "off"`},
		{"forward_auth listen", "forward_auth: {listen: \"8082\"}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:1: forward_auth.listen: "8082": want host:port`},
		{"per 0s", "rules:\n  - name: a\n    limits:\n      - {requests: 5, per: 0s}\n", "p.yaml:4: rules[0].limits[0]: per is missing or 0"},
		{"zero requests", "rules:\n  - name: a\n    limits:\n      - {requests: 0, per: 1s}\n", "p.yaml:4: rules[0].limits[0]: requests 0: want 1 or more"},
		{"bad cidr", "client_ip:\n  trusted_proxies: [10.0.0.0/8, 300.1.1.1/8]\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:2: client_ip.trusted_proxies[1]: "300.1.1.1/8": want a CIDR`},
		{"bad key", "rules:\n  - name: a\n    key: [cookie:sid]\n    limits: [{requests: 1, per: 1s}]\n", `p.yaml:3: rules[0].key[0]: "cookie:sid": want ip, header:NAME, query:NAME or jwt:CLAIM`},
		{"duplicate rule", "rules:\n  - name: a\n    limits: [{requests: 1, per: 1s}]\n  - name: a\n    limits: [{requests: 1, per: 1s}]\n", `p.yaml:4: rules[1].name: "a" is also rules[0]'s name`},
		{"lowercase method", "rules:\n  - match: {methods: [get]}\n    limits: [{requests: 1, per: 1s}]\n", `rules[0].match.methods[0]: "get": write methods in capitals`},
		{"path without slash", "rules:\n  - match: {path_prefix: api}\n    limits: [{requests: 1, per: 1s}]\n", `rules[0].match.path_prefix: "api": a path prefix starts with /`},
		{"limits nothing", "rules:\n  - name: a\n", "p.yaml:2: rules[0].limits: the rule limits nothing"},
		{"ladder", "tarpit: {drip_above: 3, reject_above: 2}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "p.yaml:1: tarpit: the ladder must climb"},
		{"tiny tick", "rules:\n  - limits: [{requests: 1000000, per: 1s, burst: 1}]\n", "needs a tick of 619ns, under 1ms: raise the burst to at least 1488"},
		{"huge burst", "rules:\n  - limits: [{requests: 10, per: 1s, burst: 1e9}]\n", "limits[0].burst: 1e+09: want 1 to 133152"},
		{"budget cost", "rules:\n  - budget: {units: 10, per: 1d, cost: 11}\n", "rules[0].budget.cost: cost 11 is more than the whole budget 10"},
		{"bad upstream", "upstream: \"ftp://x\"\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `p.yaml:1: upstream: "ftp://x": want an http:// or https:// URL`},
		{"server timeout", "server: {read_header_timeout: 1ms}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "p.yaml:1: server.read_header_timeout: want 10ms to 5m"},
		{"bad source", "client_ip: {source: cookie}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `client_ip.source: "cookie": want x-forwarded-for, forwarded, x-real-ip or header:NAME`},
		{"bad set_header", "client_ip: {set_header: \"X Real\"}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", `client_ip.set_header: "X Real": not a header name`},
		{"bad refused", "rules:\n  - refused: sometimes\n    limits: [{requests: 1, per: 1s}]\n", `p.yaml:2: rules[0].refused: "sometimes": want free`},
		{"free tarpit", "rules:\n  - refused: free\n    tarpit: true\n    limits: [{requests: 1, per: 1s}]\n", `rules[0].refused: "free" with tarpit`},
		{"uncleaned prefix", "rules:\n  - match: {path_prefix: /api//v1/}\n    limits: [{requests: 1, per: 1s}]\n", `rules[0].match.path_prefix: "/api//v1/": requests are matched on cleaned paths, so this prefix would never match: write "/api/v1/"`},
		{"body timeout", "server: {body_timeout: 2h}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "server.body_timeout: want 10ms to 1h"},
		{"buffer", "server: {buffer_body: -1}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "server.buffer_body: -1: want 0 (stream at once) to 64 MiB"},
		{"remember", "new_keys: {window: 10m, remember: 1m}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "new_keys.remember: want window (default 1m) to 30d"},
		{"not UTF-8", "listen: \":1\"\n# caf\xe9\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "p.yaml:2: byte 0xE9 at column 6 is not UTF-8: save the file as UTF-8"},
		{"not UTF-8 in a value", "rules:\n  - name: \xff\n    limits: [{requests: 1, per: 1s}]\n", "p.yaml:2: byte 0xFF at column 11 is not UTF-8"},
		{"tab before a list item", "rules:\n\t- name: a\n", "p.yaml:2: found character that cannot start any token (the line is indented with a tab: YAML indents with spaces)"},
		{"a list at the top", "- a\n- b\n", "p.yaml:1: a seq where the file's settings belong: the top level is a mapping"},
		{"ipv6 prefix", "client_ip: {ipv6_prefix: 129}\nrules:\n  - limits: [{requests: 1, per: 1s}]\n", "client_ip.ipv6_prefix: 129: want 1 to 128"},
	} {
		_, err := ParseConfig("p.yaml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v\nwant an error containing %q", c.name, err, c.want)
		}
	}
}

// Validate only checks, and New works on a copy: neither changes the
// caller's Config (defaults are applied to the copy, in one place).
func TestValidateAndNewDoNotChangeTheConfig(t *testing.T) {
	five := 5
	cfg := &Config{
		Server: ServerConfig{BufferBody: &five},
		Rules:  []Rule{{Key: []string{"ip"}, Limits: []Limit{{Requests: 10, Per: Duration(time.Second)}}, Budget: &Budget{Units: 100, Per: Duration(time.Hour)}}},
	}
	before := fmt.Sprintf("%+v %+v %+v %d", *cfg, cfg.Rules[0], *cfg.Rules[0].Budget, *cfg.Server.BufferBody)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	if after := fmt.Sprintf("%+v %+v %+v %d", *cfg, cfg.Rules[0], *cfg.Rules[0].Budget, *cfg.Server.BufferBody); after != before {
		t.Errorf("the caller's Config changed:\n%s\n%s", before, after)
	}
	if got := mw.state.Load().cfg; got.Listen != ":8080" || got.Rules[0].Name != "rule1" || got.Rules[0].Budget.Cost != 1 {
		t.Errorf("the running copy lacks its defaults: %+v", got)
	}
}

func writeSecret(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(strings.Repeat("s", 32)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A nil *Config is an error that says what to pass, not a crash.
func TestNilConfig(t *testing.T) {
	if _, err := New(nil, http.NotFoundHandler(), Options{}); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("New(nil): %v", err)
	}
	cfg, err := ParseConfig("t", []byte(MinimalConfig))
	if err != nil {
		t.Fatal(err)
	}
	mw, err := New(cfg, http.NotFoundHandler(), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer mw.Close()
	if err := mw.Reload(nil); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Errorf("Reload(nil): %v", err)
	}
	if err := (*Config)(nil).Validate(); err == nil {
		t.Error("a nil Config validated")
	}
}

// A value the YAML library cannot decode names its field, as every other
// error does, and an unknown field names its section and the field meant.
func TestConfigErrorPaths(t *testing.T) {
	rule := "rules:\n  - limits: [{requests: 1, per: 1s}]\n"
	for _, c := range []struct {
		name, src, want string
	}{
		{"duration in a section", "server:\n  idle_timeout: forever\n" + rule, `p.yaml:2: server.idle_timeout: duration "forever": want e.g. 1s, 10m, 24h or 1d`},
		{"duration in a flow list", "rules:\n  - limits: [{requests: 1, per: 10x}]\n", `p.yaml:2: rules[0].limits[0].per: duration "10x"`},
		{"duration in a budget", "rules:\n  - budget:\n      units: 10\n      per: 1 day\n", `p.yaml:4: rules[0].budget.per: duration "1 day"`},
		{"number", "sketch: {buckets: lots}\n" + rule, `p.yaml:1: sketch.buckets: a str "lots" where a int belongs`},
		{"misspelt in a rule", "rules:\n  - name: a\n    lmits:\n      - {requests: 1, per: 1s}\n", `p.yaml:3: unknown field "lmits" in rules[0]: did you mean limits?`},
		{"misspelt at the top", "lisen: \":1\"\n" + rule, `p.yaml:1: unknown field "lisen": did you mean listen?`},
		{"misspelt two deep", "rules:\n  - limits: [{requests: 1, per: 1s, brust: 2}]\n", `unknown field "brust" in rules[0].limits[0]: did you mean burst?`},
		{"in the wrong section", "trusted_proxies: [10.0.0.1]\n" + rule, `p.yaml:1: unknown field "trusted_proxies": it belongs under client_ip`},
		{"a word of a field", "rules:\n  - match: {path: /api/}\n    limits: [{requests: 1, per: 1s}]\n", `p.yaml:2: unknown field "path" in rules[0].match: did you mean path_prefix? (forward_auth has a field path of its own)`},
		{"no likeness", "rules:\n  - colour: red\n    limits: [{requests: 1, per: 1s}]\n", `unknown field "colour" in rules[0]: the fields here are name, match, key,`},
		{"envoy descriptor", "envoy_rls:\n  listen: \":1\"\n  domains:\n    - domain: d\n      descriptors:\n        - key: k\n          rate_limt: {unit: second, requests_per_unit: 1}\n",
			`p.yaml:7: unknown field "rate_limt" in envoy_rls.domains[0].descriptors[0]: did you mean rate_limit?`},
	} {
		_, err := ParseConfig("p.yaml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v\nwant an error containing %q", c.name, err, c.want)
		}
	}
}

// An envoyproxy/ratelimit file named in envoy_rls.files gets the same
// words, with its own name and the path inside it.
func TestRLSFileErrorPaths(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "api.yaml"), []byte("domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, nmae: x}\n"), 0o600)
	main := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(main, []byte("envoy_rls:\n  listen: \":1\"\n  files: [api.yaml]\n"), 0o600)
	_, err := LoadConfig(main)
	want := `api.yaml:4: unknown field "nmae" in descriptors[0].rate_limit: did you mean name?`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant an error containing %q", err, want)
	}
}

// A file that is not UTF-8 is named with the line and column of its first
// bad byte, in the main config and in an envoyproxy/ratelimit file alike;
// UTF-16 with its byte order mark, which the YAML library reads, and a
// UTF-8 byte order mark still load.
func TestConfigEncodings(t *testing.T) {
	src := "rules:\n  - name: a\n    limits: [{requests: 1, per: 1s}]\n"
	u16 := []byte{0xff, 0xfe}
	for _, r := range src {
		u16 = append(u16, byte(r), 0)
	}
	for name, data := range map[string][]byte{"utf-16": u16, "utf-8 bom": append([]byte("\xef\xbb\xbf"), src...)} {
		if c, err := ParseConfig("p.yaml", data); err != nil || len(c.Rules) != 1 {
			t.Errorf("%s: %v", name, err)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "api.yaml"), []byte("domain: api\ndescriptors:\n  - key: k\xe9\n"), 0o600)
	main := filepath.Join(dir, "proxy.yaml")
	os.WriteFile(main, []byte("envoy_rls:\n  listen: \":1\"\n  files: [api.yaml]\n"), 0o600)
	_, err := LoadConfig(main)
	if want := "api.yaml:3: byte 0xE9 at column 11 is not UTF-8"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got %v\nwant an error containing %q", err, want)
	}
}
