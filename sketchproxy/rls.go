package sketchproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// EnvoyRLSConfig serves Envoy's rate-limit service
// (envoy.service.ratelimit.v3.RateLimitService) over gRPC, for Envoy's and
// Istio's ratelimit filters. Its domains have the shape of
// envoyproxy/ratelimit's configuration files, so those files move over as
// they are: inline under domains, or named in files.
type EnvoyRLSConfig struct {
	// Listen is the gRPC address (required), e.g. "127.0.0.1:8081".
	Listen string `yaml:"listen"`
	// Domains are envoyproxy/ratelimit domain configurations.
	Domains []RLSDomain `yaml:"domains"`
	// Files are envoyproxy/ratelimit configuration files, one domain each,
	// relative to this config's directory.
	Files []string `yaml:"files"`
	// MergeDomains merges domains given more than once (in Domains or
	// Files) into one, as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG does;
	// a descriptor given twice at one level is still an error. Off, a
	// domain given twice is an error (envoyproxy/ratelimit's default).
	MergeDomains bool `yaml:"merge_domains"`
	// Directory is a directory of envoyproxy/ratelimit configuration
	// files, relative to this config's directory: every *.yaml and *.yml
	// file directly in it is loaded as Files are, in name order; names
	// starting with "." (Kubernetes' ..data) and subdirectories are
	// skipped. cmd/sketchproxy reloads the config when the directory's
	// files change, a symlink swap included (rlsdir.go).
	Directory string `yaml:"directory"`
	// WatchEvery is how often cmd/sketchproxy looks for changes in
	// Directory and in the TLS files (default 1s).
	WatchEvery Duration `yaml:"watch_every"`
	// TLS serves the gRPC listener over TLS, or mutual TLS (nil: plain
	// gRPC).
	TLS *RLSTLSConfig `yaml:"tls"`

	loaded   [3]int   // what validation loaded: Loaded
	warnings []string // what validation ignored: Warnings
	digest   string   // what validation read of Directory: LoadedDirectoryDigest
}

// Loaded reports what the validated config's envoy_rls loaded: its domains
// (merged ones once), its descriptors, and how many of those have a
// rate_limit (unlimited ones included). All are 0 before validation.
func (r *EnvoyRLSConfig) Loaded() (domains, descriptors, limits int) {
	if r == nil {
		return 0, 0, 0
	}
	return r.loaded[0], r.loaded[1], r.loaded[2]
}

// rlsBuilt is the envoy_rls domains, compiled.
type rlsBuilt struct {
	merge   bool                // envoy_rls.merge_domains
	domains map[string]*rlsNode // by name
	rules   []Rule              // one per descriptor with a limit
	nodes   int                 // descriptors loaded
	warned  []string            // fields loaded and ignored (rlsdir.go)
	digest  string              // the directory's files, as read (rlsdir.go)
}

// RLSDomain is one domain: a tree of descriptors.
type RLSDomain struct {
	Domain      string          `yaml:"domain"`
	Descriptors []RLSDescriptor `yaml:"descriptors"`
}

// RLSDescriptor matches one entry of a request's descriptor: its key, and
// its value if Value is set. A value with * matches as envoyproxy/ratelimit
// does: each * stands for any run of bytes (files/*, foo*bar); no value
// matches any. Exact values are tried first, then the wildcard values in
// the order given, then the descriptor without a value.
type RLSDescriptor struct {
	Key         string          `yaml:"key"`
	Value       string          `yaml:"value"`
	RateLimit   *RLSRateLimit   `yaml:"rate_limit"`
	Descriptors []RLSDescriptor `yaml:"descriptors"`
	// ShadowMode decides and counts but never answers OVER_LIMIT.
	ShadowMode bool `yaml:"shadow_mode"`
	// QuotaMode makes the limit one quota among the request's: the request
	// is over only if every quota descriptor is (or an ordinary one). A
	// quota it is over still reads OVER_LIMIT in its status, and does not
	// count the request's hits.
	QuotaMode bool `yaml:"quota_mode"`
	// ShareThreshold makes every value a wildcard Value matches share one
	// count, instead of one count per value. It needs a * in Value.
	ShareThreshold bool `yaml:"share_threshold"`
	// DetailedMetric and ValueToMetric are accepted for
	// envoyproxy/ratelimit's files: they name its statistics, and
	// SketchProxy's metrics are per descriptor already.
	DetailedMetric bool `yaml:"detailed_metric"`
	ValueToMetric  bool `yaml:"value_to_metric"`
	// Metadata is accepted for envoyproxy/ratelimit's newer files and
	// ignored, with a warning naming the file and line.
	Metadata any `yaml:"metadata"`
}

// RLSRateLimit is a descriptor's limit: RequestsPerUnit per Unit (second,
// minute, hour, day, week, month: 30 days, year: 365 days), or Unlimited.
// RequestsPerUnit 0 answers every request that adds hits OVER_LIMIT; in a
// parsed file it must be written, not left out. A limit with a Name is not
// applied to a request in which another matched descriptor's limit
// Replaces it.
type RLSRateLimit struct {
	Name            string       `yaml:"name"`
	Unit            string       `yaml:"unit"`
	RequestsPerUnit float64      `yaml:"requests_per_unit"`
	Unlimited       bool         `yaml:"unlimited"`
	Replaces        []RLSReplace `yaml:"replaces"`
}

// RLSReplace names a limit (its rate_limit.name) that the limit listing it
// replaces.
type RLSReplace struct {
	Name string `yaml:"name"`
}

var rlsUnits = map[string]struct {
	d time.Duration
	u rlsv3.RateLimitResponse_RateLimit_Unit
}{
	"second": {time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	"minute": {time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	"hour":   {time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	"day":    {24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	"week":   {7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	"month":  {30 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_MONTH},
	"year":   {365 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_YEAR},
}

// rlsNode is a compiled descriptor: its children by key and value (exact,
// then wildcard, then any value), and its limit, if any.
type rlsNode struct {
	exact     map[[2]string]*rlsNode
	wild      []rlsWild
	any       map[string]*rlsNode
	limit     rlsLimitKind
	rule      int // index in the rules (and state.rlsRules); -1: none
	name      string
	replaces  []string
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	requests  uint32
	quota     bool   // quota_mode
	share     bool   // share_threshold: count every matching value as one
	pattern   string // the wildcard value this node was declared with
	wildParts []string
}

// rlsLimitKind is what a node's rate_limit says.
type rlsLimitKind uint8

const (
	rlsNone      rlsLimitKind = iota // no rate_limit: no limit
	rlsLimited                       // requests per unit, counted in a rule's sketch
	rlsUnlimited                     // unlimited: true
	rlsBlock                         // requests_per_unit: 0: every hit is over
)

type rlsWild struct {
	key string
	n   *rlsNode
}

func newRLSNode() *rlsNode {
	return &rlsNode{exact: map[[2]string]*rlsNode{}, any: map[string]*rlsNode{}, rule: -1}
}

// child finds the node for one request entry, and whether it was found
// through a wildcard value with share_threshold.
func (n *rlsNode) child(key, value string) (c *rlsNode, shared bool) {
	if c := n.exact[[2]string{key, value}]; c != nil {
		return c, false
	}
	for _, w := range n.wild {
		if w.key == key && wildcardMatch(w.n.wildParts, value) {
			return w.n, w.n.share
		}
	}
	return n.any[key], false
}

// unlimitedBelow counts the unlimited descriptors under n.
func (n *rlsNode) unlimitedBelow() int {
	count := 0
	each := func(c *rlsNode) {
		if c.limit == rlsUnlimited {
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

// wildcardMatch reports whether value matches a wildcard value split at
// its *s: it starts with the first part, ends with the last, and holds the
// others in order between them, each * standing for any run of bytes.
func wildcardMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

// validateEnvoyRLS loads and compiles the domains.
func (c *Config) validateEnvoyRLS(b *rlsBuilt) error {
	r := c.EnvoyRLS
	if r == nil {
		return nil
	}
	if r.Listen == "" {
		return c.errAt(`missing: the gRPC address, e.g. listen: "127.0.0.1:8081"`, "envoy_rls", "listen")
	}
	*b = rlsBuilt{merge: r.MergeDomains, domains: map[string]*rlsNode{}}
	for i := range r.Domains {
		if err := b.compile(c, &r.Domains[i], "envoy_rls", "domains", i); err != nil {
			return err
		}
	}
	for i, f := range r.Files {
		path := f
		if !filepath.IsAbs(path) && c.src != "" {
			path = filepath.Join(filepath.Dir(c.src), f)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return c.errAt(err.Error(), "envoy_rls", "files", i)
		}
		fc, d, err := parseRLSFile(path, data)
		if err != nil {
			return err
		}
		if err := b.compile(fc, d); err != nil {
			return err
		}
	}
	if err := c.loadRLSDirectory(b); err != nil {
		return err
	}
	if err := c.validateRLSTLS(); err != nil {
		return err
	}
	if len(b.domains) == 0 && r.Directory == "" {
		return c.errAt("no domains: give domains, files or directory", "envoy_rls")
	}
	limits := len(b.rules)
	for _, root := range b.domains {
		limits += root.unlimitedBelow()
	}
	r.loaded, r.warnings, r.digest = [3]int{len(b.domains), b.nodes, limits}, b.warned, b.digest
	return nil
}

// parseRLSFile reads an envoyproxy/ratelimit configuration file: unknown
// fields are errors with the file and line.
func parseRLSFile(name string, data []byte) (*Config, *RLSDomain, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, yamlError(name, err)
	}
	var d RLSDomain
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&d); errors.Is(err, io.EOF) {
		return nil, nil, &ConfigError{File: name, Msg: "the file is empty: want domain: and descriptors:"}
	} else if err != nil {
		return nil, nil, yamlError(name, err)
	}
	return &Config{src: name, root: &root}, &d, nil
}

// compile adds domain d, found at path in c's document, to r.
func (r *rlsBuilt) compile(c *Config, d *RLSDomain, path ...any) error {
	at := func(msg string, more ...any) error { return c.errAt(msg, append(cloneAnys(path), more...)...) }
	if d.Domain == "" {
		return at("missing: every domain needs a name (domain: edge)", "domain")
	}
	root := r.domains[d.Domain]
	switch {
	case root == nil:
		root = newRLSNode()
		r.domains[d.Domain] = root
	case !r.merge:
		return at(fmt.Sprintf("%q is given twice: give each domain once, or set envoy_rls.merge_domains: true to merge them", d.Domain), "domain")
	}
	var walk func(n *rlsNode, ds []RLSDescriptor, names []string, path []any) error
	walk = func(n *rlsNode, ds []RLSDescriptor, names []string, path []any) error {
		for i := range ds {
			dd := &ds[i]
			p := append(cloneAnys(path), "descriptors", i)
			if dd.Key == "" {
				return c.errAt("missing: every descriptor needs a key", append(p, "key")...)
			}
			child := newRLSNode()
			twice := func() error {
				return c.errAt(fmt.Sprintf("%s=%s is given twice at this level", dd.Key, dd.Value), p...)
			}
			switch v := dd.Value; {
			case v == "":
				if n.any[dd.Key] != nil {
					return c.errAt(fmt.Sprintf("key %q without a value is given twice at this level", dd.Key), p...)
				}
				n.any[dd.Key] = child
			case strings.Contains(v, "*"):
				for _, w := range n.wild {
					if w.key == dd.Key && w.n.pattern == v {
						return twice()
					}
				}
				child.pattern, child.wildParts, child.share = v, strings.Split(v, "*"), dd.ShareThreshold
				n.wild = append(n.wild, rlsWild{dd.Key, child})
			default:
				k := [2]string{dd.Key, v}
				if n.exact[k] != nil {
					return twice()
				}
				n.exact[k] = child
			}
			if dd.ShareThreshold && !strings.Contains(dd.Value, "*") {
				return c.errAt(fmt.Sprintf("share_threshold needs a wildcard value (with *), not %q", dd.Value), append(p, "share_threshold")...)
			}
			r.nodes++
			if dd.Metadata != nil {
				r.warn(c, append(p, "metadata"))
			}
			label := dd.Key
			if dd.Value != "" {
				label += "=" + dd.Value
			}
			names := append(append([]string(nil), names...), label)
			if rl := dd.RateLimit; rl != nil {
				if err := r.limit(c, child, dd, printable("envoy:"+d.Domain+":"+strings.Join(names, ":")), append(p, "rate_limit")); err != nil {
					return err
				}
			}
			if err := walk(child, dd.Descriptors, names, p); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root, d.Descriptors, nil, path)
}

// limit compiles descriptor dd's rate_limit, at path p, into node n: a
// rule named name for a counted limit.
func (r *rlsBuilt) limit(c *Config, n *rlsNode, dd *RLSDescriptor, name string, p []any) error {
	rl := dd.RateLimit
	for j, rp := range rl.Replaces {
		switch {
		case rp.Name == "":
			return c.errAt("missing: the name of the limit replaced", append(p, "replaces", j, "name")...)
		case rp.Name == rl.Name:
			return c.errAt(fmt.Sprintf("%q is this limit's own name: a limit cannot replace itself", rp.Name), append(p, "replaces", j, "name")...)
		}
		n.replaces = append(n.replaces, rp.Name)
	}
	n.name, n.quota = rl.Name, dd.QuotaMode
	if rl.Unlimited {
		n.limit = rlsUnlimited
		return nil
	}
	u, ok := rlsUnits[strings.ToLower(rl.Unit)]
	if !ok {
		return c.errAt(fmt.Sprintf("%q: want second, minute, hour, day, week, month or year", rl.Unit), append(p, "unit")...)
	}
	if rl.RequestsPerUnit != math.Trunc(rl.RequestsPerUnit) || rl.RequestsPerUnit < 0 || rl.RequestsPerUnit > engine.MaxThreshold {
		return c.errAt(fmt.Sprintf("%g: want a whole number from 0 (refuse every request) to %d", rl.RequestsPerUnit, engine.MaxThreshold), append(p, "requests_per_unit")...)
	}
	if rl.RequestsPerUnit == 0 && c.root != nil && !c.given(append(p, "requests_per_unit")...) {
		return c.errAt("missing: requests_per_unit (write 0 to refuse every request)", p...)
	}
	n.unit, n.requests = u.u, uint32(rl.RequestsPerUnit)
	rule := Rule{Shadow: dd.ShadowMode, Refused: "free"}
	if rl.RequestsPerUnit == 0 {
		n.limit = rlsBlock // a rule without limits: metrics only
	} else {
		if engine.TickFor(rl.RequestsPerUnit, u.d, rl.RequestsPerUnit) < time.Millisecond {
			return c.errAt(fmt.Sprintf("%g per %s needs a tick under 1ms", rl.RequestsPerUnit, rl.Unit), p...)
		}
		n.limit = rlsLimited
		rule.Limits = []Limit{{Name: "limit", Requests: rl.RequestsPerUnit, Per: Duration(u.d), Burst: rl.RequestsPerUnit}}
	}
	// The rule's name keys its counts and metrics: unique, even where
	// printable folded two names into one.
	for _, o := range r.rules {
		if o.Name == name {
			name += "#" + strconv.Itoa(len(r.rules))
			break
		}
	}
	rule.Name = name
	n.rule = len(r.rules)
	r.rules = append(r.rules, rule)
	return nil
}

func cloneAnys(p []any) []any { return append([]any(nil), p...) }

// printable keeps a rule name fit for a RateLimit header's quoted string
// and a log line: printable ASCII but for " and \; the rest becomes _.
func printable(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			b[i] = '_'
		}
	}
	return string(b)
}

// Bounds on one ShouldRateLimit request: Envoy sends a few descriptors of a
// few short entries; anything far larger is refused, not hashed.
const (
	maxRLSDescriptors = 64
	maxRLSEntries     = 16
	maxRLSValue       = 4096
)

// RegisterRateLimitService registers Envoy's rate-limit service, answered
// from the envoy_rls domains of the running config, and the standard gRPC
// health service on s.
func (m *Middleware) RegisterRateLimitService(s *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(s, &rlsServer{m: m})
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
}

type rlsServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	m *Middleware
}

// rlsHit is one descriptor's decision.
type rlsHit struct {
	n    *rlsNode // the node the descriptor leads to, with a rate_limit; nil: no limit
	ru   *engine.Rule
	key  string
	hits uint32
	engine.Hits
	negative bool
}

// ShouldRateLimit decides every descriptor as envoyproxy/ratelimit does
// (the limit of the node the whole descriptor leads to, unless another
// matched descriptor's limit replaces it; none: OK), then counts the hits
// of every matched descriptor if the request is allowed (refusals are
// free, as rules' refused: free). Unknown domains are OK: the limiter
// fails open.
func (s *rlsServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	m := s.m
	st := m.state.Load()
	now := m.now()
	m.met.rlsRequests.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "domain is empty: Envoy's ratelimit filter must name one")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return nil, status.Error(codes.InvalidArgument, "no descriptors")
	}
	if len(ds) > maxRLSDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d", len(ds), maxRLSDescriptors)
	}
	hits := req.GetHitsAddend()
	if hits == 0 {
		hits = 1
	}
	root := st.b.rls.domains[req.GetDomain()]
	if root == nil {
		m.met.rlsUnknownDomain.Add(1)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	decided := make([]rlsHit, len(ds))
	// Match every descriptor first: a limit applies only if no other
	// matched limit replaces it.
	replaced := false
	for i, d := range ds {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		es := d.GetEntries()
		if len(es) > maxRLSEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d", i, len(es), maxRLSEntries)
		}
		h := &decided[i]
		h.hits = hits
		if ha := d.GetHitsAddend(); ha != nil {
			h.hits = uint32(min(ha.GetValue(), math.MaxUint32))
		}
		h.negative = d.GetIsNegativeHits()
		n := root
		var key strings.Builder
		for j, e := range es {
			if e.GetKey() == "" {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d entry %d has no key", i, j)
			}
			if len(e.GetKey()) > maxRLSValue || len(e.GetValue()) > maxRLSValue {
				return nil, status.Errorf(codes.InvalidArgument, "descriptor %d entry %d is longer than %d bytes", i, j, maxRLSValue)
			}
			v := e.GetValue()
			if n != nil {
				var shared bool
				if n, shared = n.child(e.GetKey(), v); shared {
					v = n.pattern // share_threshold: one count for every matching value
				}
			}
			key.WriteString(strconv.Itoa(len(v)))
			key.WriteByte(':')
			key.WriteString(v)
		}
		// No entries lead nowhere: no limit, as in envoyproxy/ratelimit.
		if len(es) > 0 && n != nil && n.limit != rlsNone {
			h.n, h.key = n, key.String()
			replaced = replaced || len(n.replaces) > 0
		}
	}
	if replaced {
		// Every matched limit's replaces count, even a replaced one's.
		gone := make([]bool, len(decided))
		for i, h := range decided {
			gone[i] = h.n != nil && h.n.name != "" && replacedBy(decided, h.n.name)
		}
		for i := range decided {
			if gone[i] {
				decided[i].n = nil
			}
		}
	}
	sc := scratchPool.Get().(*engine.Scratch)
	defer func() { sc.Reset(); scratchPool.Put(sc) }()
	var failed, quotas, quotasOver int
	for i := range decided {
		h := &decided[i]
		if h.n == nil {
			continue
		}
		switch h.n.limit {
		case rlsUnlimited:
			resp.Statuses[i].LimitRemaining = math.MaxUint32 // as envoyproxy/ratelimit
			h.n = nil
			continue
		case rlsBlock:
			h.ru = st.set.RLSRules[h.n.rule]
			h.Over, h.Never = h.hits > 0, h.hits > 0 // no room at all
		case rlsLimited:
			h.ru = st.set.RLSRules[h.n.rule]
			h.Hits = m.eng.CheckHits(st.set, h.ru, h.ru.Limits[0], h.key, h.hits, now, sc)
		}
		if h.negative {
			h.Over, h.Never = false, false
		}
		if h.n.quota {
			quotas++
		}
		if h.Over && !h.ru.Shadow {
			if h.n.quota {
				quotasOver++
			} else {
				failed++
			}
		}
	}
	// Over if an ordinary descriptor is, or every quota descriptor is
	// (envoyproxy/ratelimit's quota_mode: one quota with room is enough).
	allQuotasOver := quotas > 0 && quotasOver == quotas
	if failed > 0 || allQuotasOver {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	allowed := resp.OverallCode == rlsv3.RateLimitResponse_OK
	// Retry-After: the longest wait of an ordinary descriptor over, and
	// the shortest of the quota descriptors if all are over; forever (no
	// Retry-After) where one can never pass.
	const forever = time.Duration(math.MaxInt64)
	retry, quotaWait := time.Duration(0), forever
	wait := func(h *rlsHit, d time.Duration) {
		if !h.Over || h.ru.Shadow {
			return
		}
		if h.Never {
			d = forever
		}
		if h.n.quota {
			quotaWait = min(quotaWait, d)
		} else {
			retry = max(retry, d)
		}
	}
	var policies []string
	var field []byte // the RateLimit field
	for i := range decided {
		h := &decided[i]
		if h.n == nil {
			continue
		}
		out := engine.Allow
		if h.Over {
			out = engine.Reject
		}
		h.ru.Counts.Count(out, h.ru.Shadow && h.Over)
		dst := resp.Statuses[i]
		dst.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: h.n.name, RequestsPerUnit: h.n.requests, Unit: h.n.unit}
		if h.Over && !h.ru.Shadow {
			dst.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if h.n.limit == rlsBlock {
			wait(h, forever)
			continue // remaining 0, and no reset: it never comes
		}
		l := h.ru.Limits[0]
		// An allowed request counts its hits on every matched descriptor
		// but a quota it was over; the field then says what is left after
		// them. A refused one says when the hits fit.
		est, add := h.Est, l.Unit
		if allowed && !h.negative && h.hits > 0 && !(h.n.quota && h.Over) {
			if after := m.eng.CountHits(st.set, h.ru, l, h.key, &h.Hits, sc); !h.Over {
				est = after
			}
		}
		if h.Over {
			add = h.Add // when these hits fit
		}
		remaining, reset, _ := engine.Status(l, est, h.Theta, add, now)
		if h.Never {
			// More hits than the whole limit pass at no estimate: no
			// duration_until_reset, which would promise a pass.
			remaining = 0
		}
		wait(h, reset)
		dst.LimitRemaining = uint32(min(remaining, math.MaxUint32))
		if !h.Never {
			dst.DurationUntilReset = durationpb.New(reset)
		}
		if h.ru.Shadow {
			continue // shadow descriptors send no fields
		}
		policies = append(policies, l.Item)
		if (allowed || h.Over) && !h.Never {
			// A call over the whole limit is never let through: its
			// policy stands, with no item promising a time to retry.
			field = engine.AppendItem(field, l.Quoted, int64(dst.LimitRemaining), engine.Seconds(reset))
		}
	}
	if allQuotasOver {
		retry = max(retry, quotaWait)
	}
	if len(policies) > 0 && !st.cfg.Headers.Off {
		add := func(k, v string) {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
		}
		add("RateLimit-Policy", strings.Join(policies, ", "))
		if len(field) > 0 {
			add("RateLimit", string(field))
		}
		if !allowed && retry < forever {
			add("Retry-After", strconv.FormatInt(engine.Seconds(retry), 10))
		}
	}
	if !allowed {
		m.met.rlsOverLimit.Add(1)
	}
	return resp, nil
}

// replacedBy reports whether a matched descriptor's limit replaces the
// limit named name.
func replacedBy(decided []rlsHit, name string) bool {
	for _, o := range decided {
		if o.n != nil && slices.Contains(o.n.replaces, name) {
			return true
		}
	}
	return false
}
