package config

import (
	"strings"
	"time"

	"google.golang.org/grpc/keepalive"
)

// EnvoyRLSConfig serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService) over gRPC, for Envoy's and
// Istio's ratelimit filters. Its domains have the shape of
// envoyproxy/ratelimit's configuration files, so those files move over as
// they are: inline under domains, or named in files.
type EnvoyRLSConfig struct {
	// Listen is the gRPC address (required).
	Listen string `yaml:"listen" reload:"restart" example:"\"127.0.0.1:8081\""`
	// Domains are envoyproxy/ratelimit domain configurations.
	Domains []RLSDomain `yaml:"domains"`
	// Files are envoyproxy/ratelimit configuration files, one domain each,
	// relative to this config's directory.
	Files []string `yaml:"files" example:"[ratelimit/api.yaml]"`
	// MergeDomains merges domains given more than once (in Domains or
	// Files) into one, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does;
	// a descriptor given twice at one level is still an error. Off, a
	// domain given twice is an error (envoyproxy/ratelimit's default).
	MergeDomains bool `yaml:"merge_domains" example:"true"`
	// ResponseHeaders is what the service asks Envoy to add to its
	// client's response: "none" (the default, as envoyproxy/ratelimit's
	// LIMIT_RESPONSE_HEADERS_ENABLED=false); "ratelimit", as
	// envoyproxy/ratelimit sends them when enabled: RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset of the most limiting
	// descriptor (the last one over its limit, else the first with the
	// least remaining); or "draft", the RateLimit-Policy and RateLimit
	// fields of draft-ietf-httpapi-ratelimit-headers-10 and Retry-After,
	// each policy named by its rate_limit's name, or by its unit
	// (per-second, ...), made unique in its domain (per-minute-2): a
	// descriptor's keys and values never reach a client. Under shadow_mode
	// both send what they would without it, but Retry-After: the call
	// passes.
	ResponseHeaders string `yaml:"response_headers" example:"draft"`
	// Refused says whether the hits of a call answered OVER_LIMIT count:
	// "free" (the default) counts nothing of a refused call, so a client
	// over its limit keeps getting its limit; "count" counts every
	// descriptor's hits, refused or not, as envoyproxy/ratelimit does
	// (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false, its default).
	Refused string `yaml:"refused" example:"count"`
	// ShadowMode answers every call OK while deciding and counting as
	// usual (envoyproxy/ratelimit's SHADOW_MODE): what would have been
	// refused is counted as a shadow refusal and logged. As theirs, the
	// descriptors' statuses and the response headers still say what
	// would have been refused; only the call's overall code is OK.
	ShadowMode bool `yaml:"shadow_mode" example:"true"`
	// ResponseDynamicMetadata returns the call's domain, descriptors, hits
	// and quota_mode violations as dynamic metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA does.
	ResponseDynamicMetadata bool `yaml:"response_dynamic_metadata" example:"true"`
	// Directory is a directory of envoyproxy/ratelimit configuration
	// files, relative to this config's directory, loaded as theirs loads
	// its runtime directory: every file in it and in its subdirectories,
	// whatever its extension, as Files are, in path order. Names starting
	// with "." are skipped, files and directories (theirs with
	// RUNTIME_IGNOREDOTFILES=true: Kubernetes' ..data holds a second copy
	// of every file). cmd/sketchproxy reloads the config when the
	// directory's files change, a symlink swap included (rlsdir.go).
	Directory string `yaml:"directory" example:"/etc/ratelimit/config"`
	// WatchEvery is how often cmd/sketchproxy looks for changes in
	// Directory and in the TLS files.
	WatchEvery Duration `yaml:"watch_every" reload:"restart" example:"1s"`
	// MaxConnectionAge closes each gRPC connection after about this long
	// (a GOAWAY, ±10% jitter, then calls in progress finish), as
	// envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE: Envoy opens a new
	// one, so its connections spread onto replicas started since, where
	// they would otherwise stay on the first ones for good. Default 24h,
	// theirs; 0s: never.
	MaxConnectionAge Duration `yaml:"max_connection_age" reload:"restart" example:"24h"`
	// MaxConnectionAgeGrace is how long calls in progress on a connection
	// past MaxConnectionAge may take before it is closed
	// (GRPC_MAX_CONNECTION_AGE_GRACE). Default 1h, theirs; 0s: no bound.
	MaxConnectionAgeGrace Duration `yaml:"max_connection_age_grace" reload:"restart" example:"1h"`
	// ConnectionTimeout is how long a new connection may take to finish
	// its TLS handshake and send HTTP/2's preface and first settings
	// (gRPC's ConnectionTimeout; gRPC's default is 120s). Default 5s,
	// 100ms to 5m: a client that sends only "PRI", or nothing, holds its
	// connection that long.
	ConnectionTimeout Duration `yaml:"connection_timeout" reload:"restart" example:"5s"`
	// MaxConnectionIdle closes a connection without a call for this long
	// (a GOAWAY; Envoy opens a new one at its next call), as gRPC's
	// keepalive MaxConnectionIdle. Default 15m; 0s: never.
	MaxConnectionIdle Duration `yaml:"max_connection_idle" reload:"restart" example:"15m"`
	// MaxConnections caps the listener's open connections; those past it
	// are closed as they are accepted. Default 0: a quarter of the
	// process's file descriptor limit (RLIMIT_NOFILE), and never more
	// than half of it (cmd/sketchproxy lowers a larger value and says
	// so), so that the HTTP doors always have descriptors left.
	MaxConnections int `yaml:"max_connections" reload:"restart" example:"4096"`
	// MaxConnectionsPerClient caps the open connections of one client IP
	// address (an Envoy opens one per worker thread); those past it are
	// closed as they are accepted. Default 256; 0: no cap.
	MaxConnectionsPerClient *int `yaml:"max_connections_per_client" reload:"restart" example:"256"`
	// TLS serves the gRPC listener over TLS, or mutual TLS (nil: plain
	// gRPC).
	TLS *RLSTLSConfig `yaml:"tls" reload:"restart; its files' contents reload by themselves"`

	loaded   [3]int   // what validation loaded: Loaded
	warnings []string // what validation ignored: Warnings
	digest   string   // what validation read of Directory: LoadedDirectoryDigest
}

// The envoy_rls.response_headers modes.
const (
	RLSHeadersNone      = "none"
	RLSHeadersRateLimit = "ratelimit"
	RLSHeadersDraft     = "draft"
)

// Loaded reports what the validated config's envoy_rls loaded: its domains
// (merged ones once), its descriptors, and how many of those have a
// rate_limit (unlimited ones included). All are 0 before validation.
func (r *EnvoyRLSConfig) Loaded() (domains, descriptors, limits int) {
	if r == nil {
		return 0, 0, 0
	}
	return r.loaded[0], r.loaded[1], r.loaded[2]
}

// RLS is envoy_rls's domains, compiled: a tree of descriptors per domain,
// and a rule per counted limit.
type RLS struct {
	merge   bool                // envoy_rls.merge_domains
	count   bool                // envoy_rls.refused: count
	domains map[string]*RLSNode // by name
	rules   []Rule              // one per descriptor with a limit
	nodes   int                 // descriptors loaded
	warned  []string            // fields loaded and ignored (rlsdir.go)
	// detailed are the names of the rules of detailed_metric descriptors:
	// the per-value series of the others go at a reload.
	detailed map[string]bool
	digest   string // the directory's files, as read (rlsdir.go)
	// policies are the draft policy names given in each domain: a call
	// names one domain, so names unique in it are unique in a response.
	policies map[string]map[string]bool
}

// RLSDomain is one domain: a tree of descriptors.
type RLSDomain struct {
	// Domain is the name Envoy's ratelimit filter sends (its domain).
	Domain string `yaml:"domain" example:"api"`
	// Descriptors are the domain's top-level descriptors.
	Descriptors []RLSDescriptor `yaml:"descriptors"`
}

// RLSDescriptor matches one entry of a request's descriptor: its key, and
// its value if Value is set. A value ending in * matches as
// envoyproxy/ratelimit's does: every value that starts with what comes
// before that * (files/* matches files/a.pdf and files/); a * elsewhere is
// a literal byte (foo*bar matches only foo*bar, as theirs: "Wildcard in the
// middle of value is not supported"). No value matches any. Exact values
// are tried first, then the wildcard values in the order given, then the
// descriptor without a value.
type RLSDescriptor struct {
	// Key is the descriptor entry's key, as Envoy's actions name it
	// (remote_address, header_match, generic_key, ...).
	Key string `yaml:"key" example:"remote_address"`
	// Value, if set, is the entry's value to match: exact, or a prefix
	// when it ends in * (only a trailing * is a wildcard). Without it every
	// value matches, each with a count of its own.
	Value string `yaml:"value" example:"files/*"`
	// RateLimit is the limit of the requests whose descriptor ends here.
	RateLimit *RLSRateLimit `yaml:"rate_limit"`
	// Descriptors are the entries that may follow this one in a request's
	// descriptor.
	Descriptors []RLSDescriptor `yaml:"descriptors"`
	// ShadowMode decides and counts but never answers OVER_LIMIT.
	ShadowMode bool `yaml:"shadow_mode" example:"true"`
	// QuotaMode makes the limit a quota, as envoyproxy/ratelimit's
	// quota_mode: a call over it is never refused for it. Its status stays
	// OK, with its limit and what remains (0 once spent), and with
	// response_dynamic_metadata the call's metadata lists it in
	// quotaModeViolations. Its hits are counted as every descriptor's are,
	// over the quota or not.
	QuotaMode bool `yaml:"quota_mode" example:"true"`
	// ShareThreshold makes every value a wildcard Value matches share one
	// count, instead of one count per value. It needs a Value ending in *,
	// as envoyproxy/ratelimit's does.
	ShareThreshold bool `yaml:"share_threshold" example:"true"`
	// DetailedMetric counts the descriptor's calls per value, as
	// envoyproxy/ratelimit's statistics do:
	// sketchproxy_envoy_rls_value_*_total, the value label the keyed hash
	// of the descriptor's values as sent, joined with "|" (sketchproxy
	// -key-label 'VALUE|VALUE' prints it). The heaviest 1,000 values of
	// all such descriptors have series of their own, the rest count in
	// each descriptor's "other"; a reload drops the series of descriptors
	// no longer configured (docs/metrics.md).
	DetailedMetric bool `yaml:"detailed_metric" example:"true"`
	// ValueToMetric does what DetailedMetric does, under
	// envoyproxy/ratelimit's other name for it.
	ValueToMetric bool `yaml:"value_to_metric" example:"true"`
	// Metadata is accepted for envoyproxy/ratelimit's newer files and
	// ignored, with a warning naming the file and line.
	Metadata any `yaml:"metadata" example:"{team: payments}"`
}

// RLSRateLimit is a descriptor's limit: RequestsPerUnit per Unit (second,
// minute, hour, day, week, month: 30 days, year: 365 days), or Unlimited.
// RequestsPerUnit 0 answers every request that adds hits OVER_LIMIT; in a
// parsed file it must be written, not left out. A limit with a Name is not
// applied to a request in which another matched descriptor's limit
// Replaces it.
type RLSRateLimit struct {
	// Name names the limit: in the draft headers' policies, and for
	// Replaces.
	Name string `yaml:"name" example:"per-client"`
	// Unit is the period: second, minute, hour, day, week, month (30
	// days) or year (365 days).
	Unit string `yaml:"unit" example:"minute"`
	// RequestsPerUnit is how many hits a value may add per Unit.
	RequestsPerUnit float64 `yaml:"requests_per_unit" example:"100"`
	// Unlimited matches the descriptor without limiting it, as
	// envoyproxy/ratelimit's unlimited does.
	Unlimited bool `yaml:"unlimited" example:"true"`
	// Replaces names the limits this one replaces in a request that
	// matches both.
	Replaces []RLSReplace `yaml:"replaces"`
}

// RLSReplace names a limit (its rate_limit.name) that the limit listing it
// replaces.
type RLSReplace struct {
	// Name is the replaced limit's rate_limit.name.
	Name string `yaml:"name" example:"per-client"`
}

// RLSUnit is a rate_limit's unit, numbered as Envoy's
// RateLimitResponse.RateLimit.Unit is, so that the service converts it as
// it is (TestRLSUnitsAreEnvoys).
type RLSUnit int32

// The units, by Envoy's numbers.
const (
	RLSUnitUnknown RLSUnit = 0
	RLSUnitSecond  RLSUnit = 1
	RLSUnitMinute  RLSUnit = 2
	RLSUnitHour    RLSUnit = 3
	RLSUnitDay     RLSUnit = 4
	RLSUnitMonth   RLSUnit = 5
	RLSUnitYear    RLSUnit = 6
	RLSUnitWeek    RLSUnit = 7
)

var rlsUnits = map[string]struct {
	d time.Duration
	u RLSUnit
}{
	"second": {time.Second, RLSUnitSecond},
	"minute": {time.Minute, RLSUnitMinute},
	"hour":   {time.Hour, RLSUnitHour},
	"day":    {24 * time.Hour, RLSUnitDay},
	"week":   {7 * 24 * time.Hour, RLSUnitWeek},
	"month":  {30 * 24 * time.Hour, RLSUnitMonth},
	"year":   {365 * 24 * time.Hour, RLSUnitYear},
}

// RLSNode is a compiled descriptor: its children by key and value (exact,
// then wildcard, then any value), and its limit, if any. A domain's root
// node has only children.
type RLSNode struct {
	exact    map[[2]string]*RLSNode
	wild     []rlsWild
	any      map[string]*RLSNode
	limit    RLSLimitKind
	rule     int // index in the rules (and the engine Set's RLSRules); -1: none
	name     string
	replaces []string
	unit     RLSUnit
	requests uint32
	quota    bool   // quota_mode
	share    bool   // share_threshold: count every matching value as one
	pattern  string // the wildcard value this node was declared with
	prefix   string // the pattern without its trailing *: what a value must start with
	detailed bool   // detailed_metric or value_to_metric: a series per value
}

// RLSLimitKind is what a descriptor's rate_limit says.
type RLSLimitKind uint8

const (
	RLSNone      RLSLimitKind = iota // no rate_limit: no limit
	RLSLimited                       // requests per unit, counted in a rule's sketch
	RLSUnlimited                     // unlimited: true
	RLSBlock                         // requests_per_unit: 0: every hit is over
)

type rlsWild struct {
	key string
	n   *RLSNode
}

func newRLSNode() *RLSNode {
	return &RLSNode{exact: map[[2]string]*RLSNode{}, any: map[string]*RLSNode{}, rule: -1}
}

// Child finds the node for one request entry, and whether it was found
// through a wildcard value with share_threshold; nil if no descriptor
// matches it.
func (n *RLSNode) Child(key, value string) (c *RLSNode, shared bool) {
	if c := n.exact[[2]string{key, value}]; c != nil {
		return c, false
	}
	for _, w := range n.wild {
		if w.key == key && strings.HasPrefix(value, w.n.prefix) {
			return w.n, w.n.share
		}
	}
	return n.any[key], false
}

// Limit is what the descriptor's rate_limit says.
func (n *RLSNode) Limit() RLSLimitKind { return n.limit }

// Rule is the index of the descriptor's rule among the engine's RLS rules
// (Built.Spec's RLSRules), or -1 where no limit is counted.
func (n *RLSNode) Rule() int { return n.rule }

// Name is the rate_limit's name, or "".
func (n *RLSNode) Name() string { return n.name }

// Replaces names the limits the rate_limit replaces.
func (n *RLSNode) Replaces() []string { return n.replaces }

// Unit is the rate_limit's unit.
func (n *RLSNode) Unit() RLSUnit { return n.unit }

// Requests is the rate_limit's requests_per_unit.
func (n *RLSNode) Requests() uint32 { return n.requests }

// Quota reports quota_mode.
func (n *RLSNode) Quota() bool { return n.quota }

// Pattern is the wildcard value the descriptor was declared with ("" for
// an exact value or none): with share_threshold, every value it matches
// counts as this one.
func (n *RLSNode) Pattern() string { return n.pattern }

// Detailed reports detailed_metric or value_to_metric: a series per value.
func (n *RLSNode) Detailed() bool { return n.detailed }

// Domain is the root of the domain called name, or nil.
func (r *RLS) Domain(name string) *RLSNode { return r.domains[name] }

// Detailed names the rules of the descriptors with detailed_metric (or
// value_to_metric): the per-value series of the others go at a reload.
func (r *RLS) Detailed() map[string]bool { return r.detailed }

// unlimitedBelow counts the unlimited descriptors under n.
func (n *RLSNode) unlimitedBelow() int {
	count := 0
	each := func(c *RLSNode) {
		if c.limit == RLSUnlimited {
			count++
		}
		count += c.unlimitedBelow()
	}
	for _, c := range n.exact {
		each(c)
	}
	for _, w := range n.wild {
		each(w.n)
	}
	for _, c := range n.any {
		each(c)
	}
	return count
}

// Keepalive is the gRPC server's connection ages and idle time, as
// envoy_rls.max_connection_age, max_connection_age_grace and
// max_connection_idle ask (pass it to grpc.KeepaliveParams): zero fields
// are gRPC's "never" and "no bound", as 0s is in the config.
func (r *EnvoyRLSConfig) Keepalive() keepalive.ServerParameters {
	return keepalive.ServerParameters{
		MaxConnectionAge:      time.Duration(r.MaxConnectionAge),
		MaxConnectionAgeGrace: time.Duration(r.MaxConnectionAgeGrace),
		MaxConnectionIdle:     time.Duration(r.MaxConnectionIdle),
	}
}
