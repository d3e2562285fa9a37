package sketchproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/epochsketch/epochsketch/rate"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// Config is SketchProxy's configuration, usually read from YAML with
// LoadConfig. Zero fields take the defaults documented on each. Where 0 is a
// setting of its own (no warmup, no delay, no leeway), a file that writes 0
// gets 0, and code that builds a Config asks for it with a negative value:
// the zero value still means the default.
type Config struct {
	// Listen is the proxy's address (default ":8080").
	Listen string `yaml:"listen"`
	// Upstream is the URL requests are proxied to (cmd/sketchproxy only;
	// the middleware wraps any handler).
	Upstream string `yaml:"upstream"`
	// Admin is the address of /metrics and /healthz (default
	// "127.0.0.1:9091"; "off" disables it). Keep it off the public network.
	Admin string `yaml:"admin"`
	// StateFile, if set, keeps the sketches across restarts: restored at
	// start (a bad file is logged and the proxy starts empty), saved every
	// StateEvery (default 1m) and at shutdown. It holds the hash keys: it is
	// written 0600; keep it private.
	StateFile  string   `yaml:"state_file"`
	StateEvery Duration `yaml:"state_every"`

	Server   ServerConfig   `yaml:"server"`
	ClientIP ClientIPConfig `yaml:"client_ip"`
	Sketch   SketchConfig   `yaml:"sketch"`
	Tarpit   TarpitConfig   `yaml:"tarpit"`
	NewKeys  NewKeysConfig  `yaml:"new_keys"`
	Headers  HeadersConfig  `yaml:"headers"`
	// JWT verifies bearer tokens for keys with a "jwt:CLAIM" part.
	JWT *JWTConfig `yaml:"jwt"`
	// Fleet shares the heavy keys' counts with other replicas through
	// Redis (nil: this proxy enforces its limits alone).
	Fleet *FleetConfig `yaml:"fleet"`
	// ForwardAuth answers a gateway's decision requests (nginx
	// auth_request, Caddy forward_auth, Traefik ForwardAuth) instead of, or
	// beside, proxying (nil: off).
	ForwardAuth *ForwardAuthConfig `yaml:"forward_auth"`
	// EnvoyRLS serves Envoy's rate-limit service over gRPC (nil: off).
	EnvoyRLS *EnvoyRLSConfig `yaml:"envoy_rls"`
	Rules    []Rule          `yaml:"rules"`

	src  string     // file name, for messages
	root *yaml.Node // the parsed document, for line numbers
}

// ServerConfig bounds what a client can hold of the proxy (cmd/sketchproxy).
type ServerConfig struct {
	// ReadHeaderTimeout is how long a client may take to send its request
	// headers (default 10s): the slowloris bound.
	ReadHeaderTimeout Duration `yaml:"read_header_timeout"`
	// IdleTimeout closes keep-alive connections idle this long (default 2m).
	IdleTimeout Duration `yaml:"idle_timeout"`
	// MaxHeaderBytes caps a request's headers (default 65536).
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// BodyTimeout is how long a client may take to send a request body,
	// counted from the end of its headers (default 30s). A body still
	// arriving then is cut off with 408. Requests without a body, and the
	// streams of an upgraded connection, are not affected.
	BodyTimeout Duration `yaml:"body_timeout"`
	// BufferBody is how much of a request body is read before the upstream
	// is contacted (default 65536; 0 streams bodies at once). A body that
	// fits is sent upstream whole, so a client that sends it slowly holds a
	// proxy goroutine but never an upstream connection; a larger one is
	// streamed once the buffer is full.
	BufferBody *int `yaml:"buffer_body"`
	// MaxInFlightPerClient caps one client address's requests in progress,
	// over all rules, including those whose body is still arriving
	// (default 64; 0: no cap). Past it: 429 with Retry-After.
	MaxInFlightPerClient *int `yaml:"max_in_flight_per_client"`
	// UpstreamTimeout is how long the upstream may stay silent: before its
	// response's headers, and between two reads of its body (default 60s,
	// as nginx's proxy_read_timeout; 0, or a negative value in code: no
	// bound). Past it the client gets 504 (cmd/sketchproxy).
	UpstreamTimeout Duration `yaml:"upstream_timeout"`
}

// ClientIPConfig says how the client's address is found.
type ClientIPConfig struct {
	// TrustedProxies are the CIDRs of proxies in front of SketchProxy (load
	// balancers, CDNs). Only when the connection comes from one of them is
	// Source read, from the right, skipping trusted hops: the first
	// untrusted address is the client.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// Source is the one header the client address is read from:
	// "x-forwarded-for" (the default), "forwarded" (RFC 7239),
	// "x-real-ip", or "header:NAME" for a header the load balancer sets,
	// such as header:CF-Connecting-IP. Every other forwarding header is
	// ignored: read the one your load balancer overwrites or appends to.
	Source string `yaml:"source"`
	// SetHeader names a header (e.g. X-Real-IP) that cmd/sketchproxy sets
	// on proxied requests to the client address it identified.
	SetHeader string `yaml:"set_header"`
	// IPv6Prefix groups IPv6 clients by this prefix length (default 64: one
	// subscriber's whole /64 is one client). IPv4Prefix likewise (default 32).
	IPv6Prefix int `yaml:"ipv6_prefix"`
	IPv4Prefix int `yaml:"ipv4_prefix"`
}

// SketchConfig sizes the sketches: one per distinct tick among the limits.
type SketchConfig struct {
	// Buckets per sketch (default 65536: 4 MiB, about 130k keys above the
	// noise; see epochsketch.BucketsFor).
	Buckets int `yaml:"buckets"`
	// TwoChoice gives each key two candidate buckets (more churn-proof).
	TwoChoice bool `yaml:"two_choice"`
}

// TarpitConfig is the ladder for keys over a limit and its hard bounds. A
// key's level is its estimate divided by the limit's threshold: at most 1 is
// allowed; above DelayAbove it is delayed before it is proxied; above
// DripAbove it gets a 429 dripped slowly without reaching the upstream;
// above RejectAbove an immediate 429; above BanAbove a 429 with Connection:
// close and a Retry-After of at least BanFor.
type TarpitConfig struct {
	DelayAbove  float64  `yaml:"delay_above"`  // default 1 (delay anything over the limit)
	DripAbove   float64  `yaml:"drip_above"`   // default 1.5
	RejectAbove float64  `yaml:"reject_above"` // default 2
	BanAbove    float64  `yaml:"ban_above"`    // default 8
	BanFor      Duration `yaml:"ban_for"`      // default 10m
	// MaxDelay is the longest a request is held, delayed or dripped
	// (default 5s; 0, or a negative value in code: none, every refusal is
	// immediate).
	MaxDelay Duration `yaml:"max_delay"`
	// DripInterval is the pause between dripped bytes (default 500ms).
	DripInterval Duration `yaml:"drip_interval"`
	// MaxHeld caps requests held at once, over all keys (default 256);
	// MaxHeldPerKey per key (default 2). A request that would pass a cap
	// gets an immediate 429 instead: tarpitting never exhausts the proxy.
	// 0 (or a negative value in code) holds none.
	MaxHeld       int `yaml:"max_held"`
	MaxHeldPerKey int `yaml:"max_held_per_key"`
}

// NewKeysConfig is the key-rotation defense. A key is new when no request
// of it was seen within about Remember. While new keys per second spike
// above SpikeFactor times their recent average (and above MinPerSecond),
// keys first seen during the spike get BudgetFactor of every limit and
// budget until Window passes. A key seen before the spike is never
// affected. For Warmup after a start without a state file no spike is
// declared: every key is new then, and the average is learning.
type NewKeysConfig struct {
	Disabled     bool     `yaml:"disabled"`
	SpikeFactor  float64  `yaml:"spike_factor"`   // default 4
	MinPerSecond float64  `yaml:"min_per_second"` // default 50
	BudgetFactor float64  `yaml:"budget_factor"`  // default 0.25
	Window       Duration `yaml:"window"`         // default 1m
	Remember     Duration `yaml:"remember"`       // default 1h
	Warmup       Duration `yaml:"warmup"`         // default 1m; 0 (negative in code): none
}

// HeadersConfig picks the rate-limit headers sent.
type HeadersConfig struct {
	// Legacy adds X-RateLimit-Limit, -Remaining and -Reset beside the IETF
	// draft's RateLimit-Policy and RateLimit.
	Legacy bool `yaml:"legacy"`
	// Off sends no rate-limit headers on allowed responses (429s keep them).
	Off bool `yaml:"off"`
}

// Rule matches requests and limits them by key.
type Rule struct {
	Name  string `yaml:"name"`
	Match Match  `yaml:"match"`
	// Key lists the parts of a request's key, joined: "ip" (the client
	// address, grouped by prefix), "header:NAME", "query:NAME", or
	// "jwt:CLAIM" (a claim of the verified bearer token: see JWTConfig).
	// Default [ip]. A missing header or parameter is the part "-"; a
	// missing or invalid token is refused with 401.
	Key []string `yaml:"key"`
	// Allow exempts clients from this rule, with no sketch work.
	Allow AllowList `yaml:"allow"`
	// Limits: every one must allow the request.
	Limits []Limit `yaml:"limits"`
	// Shadow decides, logs and counts, but lets every request through.
	Shadow bool `yaml:"shadow"`
	// Tarpit applies the ladder; without it, over the limit is a 429.
	Tarpit bool `yaml:"tarpit"`
	// Budget is a wallet: a cost per request, reconciled from the upstream.
	Budget *Budget `yaml:"budget"`
	// Refused says whether requests this rule's limits refuse count
	// against them: "free" (the default without tarpit) counts only the
	// requests the proxy lets through, so a client over the limit still
	// gets the limit, as with nginx limit_req or a token bucket; "count"
	// (the default, and the only choice, with tarpit) counts every attempt,
	// so a client that keeps hammering stays refused until it slows down:
	// the punitive mode for abuse, and what the tarpit's ladder grades.
	Refused string `yaml:"refused"`
	// MaxInFlight caps one key's requests in progress (streams), 0 = none.
	MaxInFlight int `yaml:"max_in_flight"`

	block  bool   // every hit is over: Envoy's requests_per_unit: 0
	policy string // the limits' name in the RateLimit fields, if not rule-limit
}

// Match selects requests; empty fields match everything.
type Match struct {
	Host string `yaml:"host"` // exact, case-insensitive, port and a trailing dot ignored
	// PathPrefix matches the cleaned path (see the README's Paths). One
	// that ends in "/" matches by segments: "/v1/" matches /v1, /v1/ and
	// /v1/x, not /v1x. Letters match in any case unless CaseSensitive.
	PathPrefix    string   `yaml:"path_prefix"`
	CaseSensitive bool     `yaml:"case_sensitive"`
	Methods       []string `yaml:"methods"` // e.g. [GET, POST]
}

// AllowList lists clients a rule skips.
type AllowList struct {
	CIDRs []string `yaml:"cidrs"`
	Keys  []string `yaml:"keys"` // whole keys, as built from Rule.Key
}

// Limit is "Requests per Per, with bursts of Burst". See LimitMath.
type Limit struct {
	Name     string   `yaml:"name"`
	Requests float64  `yaml:"requests"`
	Per      Duration `yaml:"per"`
	// Burst is the most requests a quiet key may send at once: default
	// (0) Requests, rounded; 1 to 8,388,607 (package rate, which compiles
	// every door's limits and package limit's alike).
	Burst float64 `yaml:"burst"`
}

// Budget is a per-key wallet: Units per Per, charged Cost per admitted
// request and then what the upstream reports in ReconcileHeader (the units
// the request really used, e.g. tokens), as a response header or trailer.
// While a request runs, Reserve units are held against the wallet: a
// request is admitted only if what is spent, what is held and its own
// reservation fit in Units. See the README's "What a budget means".
type Budget struct {
	Name  string   `yaml:"name"`
	Units float64  `yaml:"units"`
	Per   Duration `yaml:"per"`
	// Cost is charged when a request is admitted (default 1): a minimum
	// charge. A reported usage above it is charged on top.
	Cost            uint64 `yaml:"cost"`
	ReconcileHeader string `yaml:"reconcile_header"`
	// Reserve is held for each request in flight until its usage is known
	// (default: Cost). Set it near a typical request's usage: N requests in
	// flight can overspend by at most N x (their usage - Reserve).
	Reserve uint64 `yaml:"reserve"`
	// Unit is how many units one count stands for (default 1). A wallet
	// holds at most 8,388,608 counts per period, so 10M tokens a day need
	// unit: 10 or more; charges round up to whole counts.
	Unit uint64 `yaml:"unit"`
	// ReconcileWait is how long an upstream response is still read after
	// its client has gone, to charge usage it reports at its end (a
	// trailer), when the proxy's transport is the Middleware's Transport
	// (default 1m; 0, or a negative value in code: not read after the
	// client has gone).
	ReconcileWait Duration `yaml:"reconcile_wait"`
	// FailOpen lets a request through when its key's spend cannot be
	// tracked (the sketch could not hold the key). Default: fail closed,
	// 503, because an untracked wallet is an unbounded one.
	FailOpen bool `yaml:"fail_open"`
}

// Duration is a time.Duration written as "10s", "1m", "24h" or "1d".
type Duration time.Duration

// UnmarshalYAML reads a duration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %v", n.Line, err)
	}
	*d = Duration(v)
	return nil
}

func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if strings.HasSuffix(s, "d") {
		n, err := strconv.ParseFloat(strings.TrimSuffix(s, "d"), 64)
		if err != nil || n <= 0 || n > 3650 {
			return 0, fmt.Errorf("duration %q: want e.g. 1s, 10m, 24h or 1d", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want e.g. 1s, 10m, 24h or 1d", s)
	}
	return d, nil
}

// ConfigError is a configuration problem, with where it is.
type ConfigError struct {
	File  string // the file, or "" for a Config built in code
	Line  int    // 0 when unknown
	Field string // e.g. rules[1].limits[0].per
	Msg   string
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteString(":")
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:", e.Line)
	}
	if b.Len() > 0 {
		b.WriteString(" ")
	}
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// LoadConfig reads and validates a YAML file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	return ParseConfig(path, b)
}

var (
	reUnknownFild = regexp.MustCompile(`field (\S+) not found in type \S+`)
	reBadType     = regexp.MustCompile("cannot construct !!(\\w+) `([^`]*)` into (\\S+)")
	reOwnLine     = regexp.MustCompile(`^line (\d+): (.*)$`) // a Duration's own error
)

// ParseConfig parses and validates YAML; name is used in messages. Unknown
// fields are errors (a typo must not silently disable a limit).
func ParseConfig(name string, data []byte) (*Config, error) {
	c := &Config{src: name}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, yamlError(name, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(c); errors.Is(err, io.EOF) {
		return nil, &ConfigError{File: name, Msg: "the file is empty: see sketchproxy -example"}
	} else if err != nil {
		return nil, yamlError(name, err)
	}
	c.src, c.root = name, &root
	if err := c.prepare(&built{}); err != nil { // the parsed Config is ours: defaults applied in place
		return nil, err
	}
	return c, nil
}

// yamlError turns the YAML library's errors into "file:line: what", with
// the line of the problem itself.
func yamlError(name string, err error) error {
	line, msg := 0, strings.TrimPrefix(err.Error(), "yaml: ")
	var les *yaml.LoadErrors
	var le *yaml.LoadError
	switch {
	case errors.As(err, &les) && len(les.Errors) > 0:
		line, msg = les.Errors[0].Mark.Line, les.Errors[0].Message
	case errors.As(err, &le):
		line, msg = le.Mark.Line, le.Message
	}
	// A Duration's own error says "line N:" itself.
	if m := reOwnLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	}
	msg = reUnknownFild.ReplaceAllString(msg, `unknown field "$1"`)
	msg = reBadType.ReplaceAllString(msg, "a $1 \"$2\" where a $3 belongs")
	return &ConfigError{File: name, Line: line, Msg: msg}
}

// lineOf finds the line of a field by path: strings are map keys, ints
// sequence indexes. It returns the deepest line found.
func (c *Config) lineOf(path ...any) int {
	line, _ := c.walk(path...)
	return line
}

// given reports whether the parsed file writes the field at path, so that
// an explicit 0 can be told from a field left out.
func (c *Config) given(path ...any) bool {
	_, found := c.walk(path...)
	return found
}

// walk follows path through the parsed document: the deepest line reached,
// and whether the whole path is there.
func (c *Config) walk(path ...any) (line int, found bool) {
	if c.root == nil || len(c.root.Content) == 0 {
		return 0, false
	}
	n := c.root.Content[0]
	line = n.Line
	for _, p := range path {
		switch k := p.(type) {
		case string:
			if n.Kind != yaml.MappingNode {
				return line, false
			}
			found := false
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == k {
					line = n.Content[i].Line
					n = n.Content[i+1]
					found = true
					break
				}
			}
			if !found {
				return line, false
			}
		case int:
			if n.Kind != yaml.SequenceNode || k >= len(n.Content) {
				return line, false
			}
			n = n.Content[k]
			line = n.Line
		}
	}
	// "field:" with nothing after it, or null, is a field left out.
	return line, !(n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// orNone applies the default of a field whose 0 is a choice of its own
// (none: no warmup, no delay, no leeway): a field left out (or left empty)
// takes def, an explicit 0 in the file is 0, and so is a negative value set
// in code. A negative value in the file is an error.
func orNone[T ~int | ~int64](c *Config, p *T, def T, path ...any) error {
	given := c.given(path...)
	switch {
	case *p < 0 && given:
		return c.errAt("want 0 (none) or more", path...)
	case *p < 0:
		*p = 0
	case *p == 0 && !given:
		*p = def
	}
	return nil
}

// fieldName renders a path as rules[1].limits[0].per.
func fieldName(path ...any) string {
	var b strings.Builder
	for _, p := range path {
		switch k := p.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(k)
		case int:
			fmt.Fprintf(&b, "[%d]", k)
		}
	}
	return b.String()
}

func (c *Config) errAt(msg string, path ...any) error {
	return &ConfigError{File: c.src, Line: c.lineOf(path...), Field: fieldName(path...), Msg: msg}
}

// Validate checks c as New would use it: with its defaults applied, to a
// copy (c itself is not changed). Errors name the field and, for parsed
// files, the line.
func (c *Config) Validate() error {
	_, _, err := c.prepared()
	return err
}

// prepared returns a copy of c with its defaults applied and checked: what
// New and Reload run on.
// spec is the prepared config as the engine compiles it.
func (c *Config) spec(b *built) *engine.Spec {
	sp := &engine.Spec{
		Buckets: c.Sketch.Buckets, TwoChoice: c.Sketch.TwoChoice,
		Tarpit: engine.TarpitSpec{
			DelayAbove: c.Tarpit.DelayAbove, DripAbove: c.Tarpit.DripAbove,
			RejectAbove: c.Tarpit.RejectAbove, BanAbove: c.Tarpit.BanAbove,
			BanFor: time.Duration(c.Tarpit.BanFor), MaxDelay: time.Duration(c.Tarpit.MaxDelay),
			MaxHeld: c.Tarpit.MaxHeld, MaxHeldPerKey: c.Tarpit.MaxHeldPerKey,
		},
		NewKeys: engine.NewKeysSpec{
			Disabled: c.NewKeys.Disabled, SpikeFactor: c.NewKeys.SpikeFactor,
			MinPerSecond: c.NewKeys.MinPerSecond, BudgetFactor: c.NewKeys.BudgetFactor,
			Window: time.Duration(c.NewKeys.Window), Remember: time.Duration(c.NewKeys.Remember),
			Warmup: time.Duration(c.NewKeys.Warmup),
		},
	}
	for _, rc := range c.Rules {
		sp.Rules = append(sp.Rules, rc.spec())
	}
	if r := c.EnvoyRLS; r != nil {
		for _, rc := range b.rls.rules {
			sp.RLSRules = append(sp.RLSRules, rc.spec())
		}
	}
	return sp
}

// spec is the prepared rule as the engine compiles it.
func (rc *Rule) spec() engine.RuleSpec {
	rs := engine.RuleSpec{Name: rc.Name, Shadow: rc.Shadow, Tarpit: rc.Tarpit, CountRefused: rc.Refused == "count", MaxInFlight: rc.MaxInFlight, Block: rc.block}
	for _, l := range rc.Limits {
		rs.Limits = append(rs.Limits, engine.LimitSpec{Name: l.Name, Policy: rc.policy, Rate: l.rate()})
	}
	if b := rc.Budget; b != nil {
		rs.Budget = &engine.BudgetSpec{Name: b.Name, Units: b.Units, Per: time.Duration(b.Per), Unit: b.Unit, Cost: b.Cost, Reserve: b.Reserve, FailOpen: b.FailOpen,
			ReconcileHeader: b.ReconcileHeader, ReconcileWait: time.Duration(b.ReconcileWait)}
	}
	return rs
}

func (c *Config) prepared() (*Config, *built, error) {
	if c == nil {
		return nil, nil, errors.New("sketchproxy: the *Config is nil: pass one from LoadConfig or ParseConfig, or a Config literal")
	}
	cp := c.clone()
	b := &built{}
	if err := cp.prepare(b); err != nil {
		return nil, nil, err
	}
	return cp, b, nil
}

// built is what preparing a Config compiles besides its defaults: what the
// doors match with, and the keys and files they read. It lives beside the
// Config in the running state, never in it: a Config is plain data.
type built struct {
	ci    clientIP
	allow []allowSet // by rule
	jwt   jwtKeyset
	rls   rlsBuilt
	fleet fleetBuilt
}

// allowSet is a rule's allow list, compiled.
type allowSet struct {
	prefixes []netip.Prefix
	keys     map[string]bool
}

// clone copies c deeply: every exported pointer, slice and map is copied,
// at every depth, so that preparing the copy (defaults are written in
// place) changes nothing of c, whatever fields a later version adds.
// Unexported fields (the parsed document, for line numbers) are shared:
// they are read only.
func (c *Config) clone() *Config {
	cp := *c
	deepen(reflect.ValueOf(&cp).Elem())
	return &cp
}

// deepen replaces the pointers, slices and maps reachable from v through
// exported fields with copies.
func deepen(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				deepen(v.Field(i))
			}
		}
	case reflect.Pointer:
		if !v.IsNil() {
			p := reflect.New(v.Type().Elem())
			p.Elem().Set(v.Elem())
			deepen(p.Elem())
			v.Set(p)
		}
	case reflect.Slice:
		if !v.IsNil() {
			s := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
			reflect.Copy(s, v)
			for i := range s.Len() {
				deepen(s.Index(i))
			}
			v.Set(s)
		}
	case reflect.Map:
		if !v.IsNil() {
			m := reflect.MakeMapWithSize(v.Type(), v.Len())
			for it := v.MapRange(); it.Next(); {
				e := reflect.New(v.Type().Elem()).Elem()
				e.Set(it.Value())
				deepen(e)
				m.SetMapIndex(it.Key(), e)
			}
			v.Set(m)
		}
	}
}

// prepare applies the defaults, the one place they are applied, and checks
// c in place.
func (c *Config) prepare(b *built) error {
	if c.Listen == "" {
		c.Listen = ":8080"
	}
	if c.Admin == "" {
		c.Admin = "127.0.0.1:9091"
	}
	if c.StateEvery == 0 {
		c.StateEvery = Duration(time.Minute)
	}
	if c.StateEvery < Duration(time.Second) {
		return c.errAt("want 1s or more", "state_every")
	}
	if c.Upstream != "" {
		u, err := url.Parse(c.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c.errAt(fmt.Sprintf("%q: want an http:// or https:// URL with a host", c.Upstream), "upstream")
		}
	}
	sv := &c.Server
	if sv.ReadHeaderTimeout == 0 {
		sv.ReadHeaderTimeout = Duration(10 * time.Second)
	}
	if sv.IdleTimeout == 0 {
		sv.IdleTimeout = Duration(2 * time.Minute)
	}
	if sv.MaxHeaderBytes == 0 {
		sv.MaxHeaderBytes = 64 << 10
	}
	if sv.ReadHeaderTimeout < Duration(10*time.Millisecond) || sv.ReadHeaderTimeout > Duration(5*time.Minute) {
		return c.errAt("want 10ms to 5m", "server", "read_header_timeout")
	}
	if sv.IdleTimeout < Duration(time.Second) {
		return c.errAt("want 1s or more", "server", "idle_timeout")
	}
	if sv.MaxHeaderBytes < 4096 || sv.MaxHeaderBytes > 16<<20 {
		return c.errAt(fmt.Sprintf("%d: want 4096 to 16 MiB", sv.MaxHeaderBytes), "server", "max_header_bytes")
	}
	if sv.BodyTimeout == 0 {
		sv.BodyTimeout = Duration(30 * time.Second)
	}
	if sv.BodyTimeout < Duration(10*time.Millisecond) || sv.BodyTimeout > Duration(time.Hour) {
		return c.errAt("want 10ms to 1h", "server", "body_timeout")
	}
	if err := orNone(c, &sv.UpstreamTimeout, Duration(time.Minute), "server", "upstream_timeout"); err != nil {
		return err
	}
	if sv.UpstreamTimeout > Duration(24*time.Hour) {
		return c.errAt("want 0 (no bound) to 24h", "server", "upstream_timeout")
	}
	if sv.BufferBody == nil {
		sv.BufferBody = ptr(64 << 10)
	}
	if *sv.BufferBody < 0 || *sv.BufferBody > 64<<20 {
		return c.errAt(fmt.Sprintf("%d: want 0 (stream at once) to 64 MiB", *sv.BufferBody), "server", "buffer_body")
	}
	if sv.MaxInFlightPerClient == nil {
		sv.MaxInFlightPerClient = ptr(64)
	}
	if *sv.MaxInFlightPerClient < 0 || *sv.MaxInFlightPerClient > 1<<20 {
		return c.errAt(fmt.Sprintf("%d: want 0 (no cap) to 2^20", *sv.MaxInFlightPerClient), "server", "max_in_flight_per_client")
	}
	ci := &c.ClientIP
	b.ci.ClientIPConfig = ci
	for i, s := range ci.TrustedProxies {
		p, err := parsePrefix(s)
		if err != nil {
			return c.errAt(err.Error(), "client_ip", "trusted_proxies", i)
		}
		b.ci.trusted = append(b.ci.trusted, p)
	}
	ci.Source = strings.ToLower(strings.TrimSpace(ci.Source))
	switch name, isHeader := strings.CutPrefix(ci.Source, "header:"); {
	case ci.Source == "":
		ci.Source = sourceXFF
	case ci.Source == sourceXFF || ci.Source == sourceForwarded || ci.Source == sourceRealIP:
	case isHeader && validHeaderName(name):
	default:
		return c.errAt(fmt.Sprintf("%q: want x-forwarded-for, forwarded, x-real-ip or header:NAME", ci.Source), "client_ip", "source")
	}
	if ci.SetHeader != "" && !validHeaderName(ci.SetHeader) {
		return c.errAt(fmt.Sprintf("%q: not a header name", ci.SetHeader), "client_ip", "set_header")
	}
	if ci.IPv6Prefix == 0 {
		ci.IPv6Prefix = 64
	}
	if ci.IPv4Prefix == 0 {
		ci.IPv4Prefix = 32
	}
	if ci.IPv6Prefix < 1 || ci.IPv6Prefix > 128 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 128", ci.IPv6Prefix), "client_ip", "ipv6_prefix")
	}
	if ci.IPv4Prefix < 1 || ci.IPv4Prefix > 32 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 32", ci.IPv4Prefix), "client_ip", "ipv4_prefix")
	}
	if c.Sketch.Buckets == 0 {
		c.Sketch.Buckets = 1 << 16
	}
	if c.Sketch.Buckets < 1 || c.Sketch.Buckets > 1<<26 {
		return c.errAt(fmt.Sprintf("%d: want 1 to 2^26 (4 GiB)", c.Sketch.Buckets), "sketch", "buckets")
	}
	t := &c.Tarpit
	def := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	def(&t.DelayAbove, 1)
	def(&t.DripAbove, 1.5)
	def(&t.RejectAbove, 2)
	def(&t.BanAbove, 8)
	if t.BanFor == 0 {
		t.BanFor = Duration(10 * time.Minute)
	}
	if err := orNone(c, &t.MaxDelay, Duration(5*time.Second), "tarpit", "max_delay"); err != nil {
		return err
	}
	if t.DripInterval == 0 {
		t.DripInterval = Duration(500 * time.Millisecond)
	}
	if err := orNone(c, &t.MaxHeld, 256, "tarpit", "max_held"); err != nil {
		return err
	}
	if err := orNone(c, &t.MaxHeldPerKey, 2, "tarpit", "max_held_per_key"); err != nil {
		return err
	}
	if !(1 <= t.DelayAbove && t.DelayAbove <= t.DripAbove && t.DripAbove <= t.RejectAbove && t.RejectAbove <= t.BanAbove) {
		return c.errAt(fmt.Sprintf("the ladder must climb: 1 <= delay_above (%g) <= drip_above (%g) <= reject_above (%g) <= ban_above (%g)",
			t.DelayAbove, t.DripAbove, t.RejectAbove, t.BanAbove), "tarpit")
	}
	if t.MaxDelay < 0 || time.Duration(t.MaxDelay) > 10*time.Minute {
		return c.errAt("want 0 to 10m", "tarpit", "max_delay")
	}
	if t.DripInterval <= 0 || t.MaxDelay > 0 && t.DripInterval > t.MaxDelay {
		return c.errAt("want more than 0 and at most max_delay", "tarpit", "drip_interval")
	}
	if t.MaxHeld < 0 || t.MaxHeldPerKey < 0 || t.MaxHeld > 1<<20 {
		return c.errAt("caps must be 0 to 2^20", "tarpit")
	}
	nk := &c.NewKeys
	def(&nk.SpikeFactor, 4)
	def(&nk.MinPerSecond, 50)
	def(&nk.BudgetFactor, 0.25)
	if nk.Window == 0 {
		nk.Window = Duration(time.Minute)
	}
	if nk.SpikeFactor < 1 {
		return c.errAt(fmt.Sprintf("%g: want 1 or more", nk.SpikeFactor), "new_keys", "spike_factor")
	}
	if nk.BudgetFactor <= 0 || nk.BudgetFactor > 1 {
		return c.errAt(fmt.Sprintf("%g: want more than 0 and at most 1", nk.BudgetFactor), "new_keys", "budget_factor")
	}
	if nk.Window < Duration(time.Second) {
		return c.errAt("want 1s or more", "new_keys", "window")
	}
	if nk.Remember == 0 {
		nk.Remember = Duration(time.Hour)
	}
	if nk.Remember < nk.Window || nk.Remember > Duration(30*24*time.Hour) {
		return c.errAt("want window (default 1m) to 30d", "new_keys", "remember")
	}
	if err := orNone(c, &nk.Warmup, Duration(time.Minute), "new_keys", "warmup"); err != nil {
		return err
	}
	if nk.Warmup < 0 || nk.Warmup > Duration(24*time.Hour) {
		return c.errAt("want 0 to 24h", "new_keys", "warmup")
	}
	if err := c.validateFleet(&b.fleet); err != nil {
		return err
	}
	if err := c.validateForwardAuth(); err != nil {
		return err
	}
	if err := c.validateEnvoyRLS(&b.rls); err != nil {
		return err
	}
	if err := c.validateJWT(&b.jwt); err != nil {
		return err
	}
	if len(c.Rules) == 0 && c.EnvoyRLS == nil {
		return c.errAt("no rules: add at least one (see sketchproxy -example)", "rules")
	}
	names := map[string]int{}
	for i := range c.Rules {
		if err := c.validateRule(b, i, names); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateRule(b *built, i int, names map[string]int) error {
	r := &c.Rules[i]
	at := func(msg string, path ...any) error { return c.errAt(msg, append([]any{"rules", i}, path...)...) }
	if r.Name == "" {
		r.Name = fmt.Sprintf("rule%d", i+1)
	}
	if !validName(r.Name) {
		return at(fmt.Sprintf("%q: use letters, digits, - and _", r.Name), "name")
	}
	if j, dup := names[r.Name]; dup {
		return at(fmt.Sprintf("%q is also rules[%d]'s name", r.Name, j), "name")
	}
	names[r.Name] = i
	if p := r.Match.PathPrefix; p != "" && !strings.HasPrefix(p, "/") {
		return at(fmt.Sprintf("%q: a path prefix starts with /", p), "match", "path_prefix")
	} else if p != "" && cleanPath(p) != p {
		return at(fmt.Sprintf("%q: requests are matched on cleaned paths, so this prefix would never match: write %q", p, cleanPath(p)), "match", "path_prefix")
	}
	if h := r.Match.Host; h != "" {
		_, name, ok := canonicalHost(h)
		if !ok || strings.HasPrefix(name, "[") != strings.HasPrefix(h, "[") {
			return at(fmt.Sprintf("%q: want a host name such as api.example.com (any case; a port or trailing dot is ignored)", h), "match", "host")
		}
		r.Match.Host = name
	}
	for j, m := range r.Match.Methods {
		if m == "" || strings.ToUpper(m) != m || strings.ContainsAny(m, " \t/") {
			return at(fmt.Sprintf("%q: write methods in capitals, e.g. GET", m), "match", "methods", j)
		}
	}
	if len(r.Key) == 0 {
		r.Key = []string{"ip"}
	}
	for j, k := range r.Key {
		name, ok := strings.CutPrefix(k, "header:")
		if !ok {
			name, ok = strings.CutPrefix(k, "query:")
		}
		claim, isJWT := strings.CutPrefix(k, "jwt:")
		if isJWT {
			if claim == "" {
				return at(fmt.Sprintf("%q: name a claim, e.g. jwt:sub", k), "key", j)
			}
			if c.JWT == nil {
				return at(fmt.Sprintf("%q needs a jwt section to verify tokens with", k), "key", j)
			}
			continue
		}
		if k != "ip" && (!ok || name == "") {
			return at(fmt.Sprintf("%q: want ip, header:NAME, query:NAME or jwt:CLAIM", k), "key", j)
		}
	}
	allow := allowSet{keys: make(map[string]bool, len(r.Allow.Keys))}
	for j, s := range r.Allow.CIDRs {
		p, err := parsePrefix(s)
		if err != nil {
			return at(err.Error(), "allow", "cidrs", j)
		}
		allow.prefixes = append(allow.prefixes, p)
	}
	for _, k := range r.Allow.Keys {
		allow.keys[k] = true
	}
	b.allow = append(b.allow, allow)
	if len(r.Limits) == 0 && r.Budget == nil && r.MaxInFlight == 0 {
		return at("the rule limits nothing: give it limits, a budget or max_in_flight", "limits")
	}
	lnames := map[string]bool{}
	for j := range r.Limits {
		l := &r.Limits[j]
		if l.Name == "" {
			l.Name = defaultLimitName(time.Duration(l.Per), lnames)
		}
		if !validName(l.Name) || lnames[l.Name] {
			return at(fmt.Sprintf("%q: names must be unique in the rule, letters, digits, - and _", l.Name), "limits", j, "name")
		}
		lnames[l.Name] = true
		if err := checkRate(l.Requests, time.Duration(l.Per)); err != nil {
			return at(err.Error(), "limits", j)
		}
		rl, err := compileRate(l.rate(), func(msg string, field string) error { return at(msg, "limits", j, field) })
		if err != nil {
			return err
		}
		l.Burst = float64(rl.Burst) // the default applied, as compiled

	}
	if b := r.Budget; b != nil {
		if b.Name == "" {
			b.Name = "budget"
		}
		if b.Cost == 0 {
			b.Cost = 1
		}
		if b.Reserve == 0 {
			b.Reserve = b.Cost
		}
		if b.Unit == 0 {
			b.Unit = 1
		}
		if err := orNone(c, &b.ReconcileWait, Duration(time.Minute), "rules", i, "budget", "reconcile_wait"); err != nil {
			return err
		}
		if err := checkRate(b.Units, time.Duration(b.Per)); err != nil {
			return at(strings.Replace(err.Error(), "requests", "units", 1), "budget")
		}
		if b.Unit > 1<<40 {
			return at(fmt.Sprintf("unit %d: at most 2^40", b.Unit), "budget", "unit")
		}
		if counts := b.Units / float64(b.Unit); counts > rate.MaxBurst {
			return at(fmt.Sprintf("units %g: at most %d counts per period (a slot's count is 24 bits, two per unit); set unit: %d or more",
				b.Units, rate.MaxBurst, uint64(math.Ceil(b.Units/rate.MaxBurst))), "budget", "units")
		} else if counts < 1 {
			return at(fmt.Sprintf("units %g is less than one unit of %d", b.Units, b.Unit), "budget", "unit")
		}
		if float64(b.Cost) > b.Units {
			return at(fmt.Sprintf("cost %d is more than the whole budget %g", b.Cost, b.Units), "budget", "cost")
		}
		if float64(b.Reserve) > b.Units {
			return at(fmt.Sprintf("reserve %d is more than the whole budget %g", b.Reserve, b.Units), "budget", "reserve")
		}
		if b.Reserve < b.Cost {
			return at(fmt.Sprintf("reserve %d is less than cost %d: a request holds at least what it is charged", b.Reserve, b.Cost), "budget", "reserve")
		}
		if b.ReconcileWait < 0 || b.ReconcileWait > Duration(time.Hour) {
			return at("want 0 to 1h", "budget", "reconcile_wait")
		}
		if r.MaxInFlight == 0 {
			r.MaxInFlight = 8 // bounds the overspend of requests in flight (see Reserve)
		}
	}
	switch r.Refused {
	case "":
		r.Refused = "free"
		if r.Tarpit {
			r.Refused = "count"
		}
	case "free":
		if r.Tarpit {
			return at(`"free" with tarpit: the ladder grades every attempt, so tarpit rules count refused requests`, "refused")
		}
	case "count":
	default:
		return at(fmt.Sprintf("%q: want free (refused requests do not count) or count", r.Refused), "refused")
	}
	if r.MaxInFlight < 0 || r.MaxInFlight > 1<<16 {
		return at(fmt.Sprintf("%d: want 0 (none) to 65536", r.MaxInFlight), "max_in_flight")
	}
	return nil
}

// defaultLimitName names a limit by its period, as it is written: per-10s,
// per-1m, per-1h30m, per-1d, per-1_5s. A second limit over the same period
// in the rule gets -2, and so on.
func defaultLimitName(per time.Duration, taken map[string]bool) string {
	var s string
	if per >= 24*time.Hour && per%(24*time.Hour) == 0 {
		s = fmt.Sprintf("%dd", per/(24*time.Hour))
	} else {
		s = per.String()
		if strings.HasSuffix(s, "m0s") {
			s = strings.TrimSuffix(s, "0s")
		}
		if strings.HasSuffix(s, "h0m") {
			s = strings.TrimSuffix(s, "0m")
		}
	}
	name := "per-" + strings.ReplaceAll(s, ".", "_")
	for n := 2; taken[name]; n++ {
		name = fmt.Sprintf("per-%s-%d", strings.ReplaceAll(s, ".", "_"), n)
	}
	return name
}

// rate is the limit as package rate compiles it, as every door's limits
// are.
func (l *Limit) rate() rate.Rate {
	return rate.Rate{Requests: l.Requests, Per: time.Duration(l.Per), Burst: l.Burst}
}

// compileRate compiles r, or says what is wrong through at, with the YAML
// name of the field at fault (requests, per or burst).
func compileRate(r rate.Rate, at func(msg, field string) error) (rate.Limit, error) {
	l, err := r.Compile()
	var re *rate.Error
	if errors.As(err, &re) {
		return l, at(re.Msg, strings.ToLower(re.Field))
	}
	return l, nil
}

func checkRate(n float64, per time.Duration) error {
	if per <= 0 {
		return fmt.Errorf("per is missing: say e.g. per: 1m")
	}
	if per < time.Millisecond || per > 366*24*time.Hour {
		return fmt.Errorf("per %v: want 1ms to 366d", per)
	}
	if !(n >= 1) || n > 1e12 {
		return fmt.Errorf("requests %g: want 1 or more", n)
	}
	return nil
}

var (
	reName   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	reHeader = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$")
)

func validHeaderName(s string) bool { return reHeader.MatchString(s) }

func ptr[T any](v T) *T { return &v }

func validName(s string) bool { return reName.MatchString(s) }

func parsePrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
		return p.Masked(), nil
	}
	if a, err := netip.ParseAddr(strings.TrimSpace(s)); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("%q: want a CIDR such as 10.0.0.0/8 or an address", s)
}
