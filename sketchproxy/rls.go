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

	domains map[string]*rlsNode // compiled
	rules   []Rule              // one per descriptor with a limit
}

// RLSDomain is one domain: a tree of descriptors.
type RLSDomain struct {
	Domain      string          `yaml:"domain"`
	Descriptors []RLSDescriptor `yaml:"descriptors"`
}

// RLSDescriptor matches one entry of a request's descriptor: its key, and
// its value if Value is set (a trailing * matches a prefix; no value
// matches any, each value counted apart).
type RLSDescriptor struct {
	Key         string          `yaml:"key"`
	Value       string          `yaml:"value"`
	RateLimit   *RLSRateLimit   `yaml:"rate_limit"`
	Descriptors []RLSDescriptor `yaml:"descriptors"`
	// ShadowMode decides and counts but never answers OVER_LIMIT.
	ShadowMode bool `yaml:"shadow_mode"`
	// DetailedMetric is accepted for envoyproxy/ratelimit's files:
	// SketchProxy's metrics are per descriptor already.
	DetailedMetric bool `yaml:"detailed_metric"`
}

// RLSRateLimit is a descriptor's limit: RequestsPerUnit per Unit (second,
// minute, hour, day, week, month: 30 days, year: 365 days), or Unlimited.
type RLSRateLimit struct {
	Name            string  `yaml:"name"`
	Unit            string  `yaml:"unit"`
	RequestsPerUnit float64 `yaml:"requests_per_unit"`
	Unlimited       bool    `yaml:"unlimited"`
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
// then prefix, then any value), and its limit, if any.
type rlsNode struct {
	exact    map[[2]string]*rlsNode
	prefix   []rlsPrefix
	any      map[string]*rlsNode
	rule     int    // index in the rules (and state.rlsRules); -1: no limit
	name     string // rate_limit.name
	unit     rlsv3.RateLimitResponse_RateLimit_Unit
	requests uint32
}

type rlsPrefix struct {
	key, prefix string
	n           *rlsNode
}

func newRLSNode() *rlsNode {
	return &rlsNode{exact: map[[2]string]*rlsNode{}, any: map[string]*rlsNode{}, rule: -1}
}

// child finds the node for one request entry.
func (n *rlsNode) child(key, value string) *rlsNode {
	if c := n.exact[[2]string{key, value}]; c != nil {
		return c
	}
	for _, p := range n.prefix {
		if p.key == key && strings.HasPrefix(value, p.prefix) {
			return p.n
		}
	}
	return n.any[key]
}

// validateEnvoyRLS loads and compiles the domains.
func (c *Config) validateEnvoyRLS() error {
	r := c.EnvoyRLS
	if r == nil {
		return nil
	}
	if r.Listen == "" {
		return c.errAt(`missing: the gRPC address, e.g. listen: "127.0.0.1:8081"`, "envoy_rls", "listen")
	}
	r.domains, r.rules = map[string]*rlsNode{}, nil
	for i := range r.Domains {
		if err := r.compile(c, &r.Domains[i], "envoy_rls", "domains", i); err != nil {
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
		if err := r.compile(fc, d); err != nil {
			return err
		}
	}
	if len(r.domains) == 0 {
		return c.errAt("no domains: give domains or files", "envoy_rls")
	}
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
func (r *EnvoyRLSConfig) compile(c *Config, d *RLSDomain, path ...any) error {
	at := func(msg string, more ...any) error { return c.errAt(msg, append(cloneAnys(path), more...)...) }
	if d.Domain == "" {
		return at("missing: every domain needs a name (domain: edge)", "domain")
	}
	if r.domains[d.Domain] != nil {
		return at(fmt.Sprintf("%q is given twice", d.Domain), "domain")
	}
	root := newRLSNode()
	r.domains[d.Domain] = root
	var walk func(n *rlsNode, ds []RLSDescriptor, names []string, path []any) error
	walk = func(n *rlsNode, ds []RLSDescriptor, names []string, path []any) error {
		for i := range ds {
			dd := &ds[i]
			p := append(cloneAnys(path), "descriptors", i)
			if dd.Key == "" {
				return c.errAt("missing: every descriptor needs a key", append(p, "key")...)
			}
			child := newRLSNode()
			switch v := dd.Value; {
			case v == "":
				if n.any[dd.Key] != nil {
					return c.errAt(fmt.Sprintf("key %q without a value is given twice at this level", dd.Key), p...)
				}
				n.any[dd.Key] = child
			case strings.HasSuffix(v, "*"):
				n.prefix = append(n.prefix, rlsPrefix{dd.Key, strings.TrimSuffix(v, "*"), child})
			default:
				k := [2]string{dd.Key, v}
				if n.exact[k] != nil {
					return c.errAt(fmt.Sprintf("%s=%s is given twice at this level", dd.Key, v), p...)
				}
				n.exact[k] = child
			}
			label := dd.Key
			if dd.Value != "" {
				label += "=" + dd.Value
			}
			names := append(append([]string(nil), names...), label)
			// unlimited: no rule, so always OK
			if rl := dd.RateLimit; rl != nil && !rl.Unlimited {
				u, ok := rlsUnits[strings.ToLower(rl.Unit)]
				if !ok {
					return c.errAt(fmt.Sprintf("%q: want second, minute, hour, day, week, month or year", rl.Unit), append(p, "rate_limit", "unit")...)
				}
				if rl.RequestsPerUnit != math.Trunc(rl.RequestsPerUnit) || rl.RequestsPerUnit < 1 || rl.RequestsPerUnit > maxThreshold {
					return c.errAt(fmt.Sprintf("%g: want a whole number from 1 to %d", rl.RequestsPerUnit, maxThreshold), append(p, "rate_limit", "requests_per_unit")...)
				}
				if tickFor(rl.RequestsPerUnit, u.d, rl.RequestsPerUnit) < time.Millisecond {
					return c.errAt(fmt.Sprintf("%g per %s needs a tick under 1ms", rl.RequestsPerUnit, rl.Unit), append(p, "rate_limit")...)
				}
				child.rule, child.name, child.unit, child.requests = len(r.rules), rl.Name, u.u, uint32(rl.RequestsPerUnit)
				// The rule's name keys its counts and metrics: unique,
				// even where printable folded two names into one.
				name := printable("envoy:" + d.Domain + ":" + strings.Join(names, ":"))
				for _, o := range r.rules {
					if o.Name == name {
						name += "#" + strconv.Itoa(len(r.rules))
						break
					}
				}
				r.rules = append(r.rules, Rule{
					Name:    name,
					Limits:  []Limit{{Name: "limit", Requests: rl.RequestsPerUnit, Per: Duration(u.d), Burst: rl.RequestsPerUnit}},
					Shadow:  dd.ShadowMode,
					Refused: "free",
				})
			}
			if err := walk(child, dd.Descriptors, names, p); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root, d.Descriptors, nil, path)
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
	n        *rlsNode
	ru       *rule
	key      string
	hits     uint32
	est      uint32
	theta    uint32
	over     bool
	negative bool
}

// ShouldRateLimit decides every descriptor as envoyproxy/ratelimit does
// (the limit of the node the whole descriptor leads to; none: OK), then
// counts the hits of every matched descriptor if the request is allowed
// (refusals are free, as rules' refused: free). Unknown domains are OK:
// the limiter fails open.
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
	root := st.rls[req.GetDomain()]
	if root == nil {
		m.met.rlsUnknownDomain.Add(1)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(ds))}
	decided := make([]rlsHit, len(ds))
	var buf []byte
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) == 0 || len(es) > maxRLSEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: want 1 to %d", i, len(es), maxRLSEntries)
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
			key.WriteString(strconv.Itoa(len(e.GetValue())))
			key.WriteByte(':')
			key.WriteString(e.GetValue())
			if n != nil {
				n = n.child(e.GetKey(), e.GetValue())
			}
		}
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if n == nil || n.rule < 0 || n.rule >= len(st.rlsRules) {
			continue // no limit: OK (unlimited nodes too)
		}
		h.n, h.ru, h.key = n, st.rlsRules[n.rule], key.String()
		l := h.ru.limits[0]
		buf = skey(buf, h.ru.cfg.Name, l.name, h.key)
		h.est = l.sk.EstimateBytes(buf)
		h.est = m.fleet.estimate(buf, l.sk, l.tick, l.theta, h.est, now)
		h.theta = l.theta
		h.over = !h.negative && uint64(h.est)+uint64(h.hits)*uint64(l.unit) > uint64(h.theta)
		if h.over && !h.ru.cfg.Shadow {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	allowed := resp.OverallCode == rlsv3.RateLimitResponse_OK
	var retry time.Duration
	var policies []string
	var field []byte // the RateLimit field
	for i := range decided {
		h := &decided[i]
		if h.ru == nil {
			continue
		}
		l := h.ru.limits[0]
		out := Allow
		if h.over {
			out = Reject
		}
		h.ru.met.count(out, h.ru.cfg.Shadow && h.over)
		est := uint64(h.est)
		if allowed && !h.negative && h.hits > 0 {
			buf = skey(buf, h.ru.cfg.Name, l.name, h.key)
			n := uint32(min(uint64(h.hits)*uint64(l.unit), 2*maxThreshold+2))
			l.sk.ObserveBytesN(time.Time{}, buf, n)
			est += uint64(n)
		}
		dst := resp.Statuses[i]
		dst.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: h.n.name, RequestsPerUnit: h.n.requests, Unit: h.n.unit}
		remaining := (int64(h.theta) - int64(min(est, math.MaxInt32))) / int64(l.unit)
		reset := untilNextTick(now, l.tick)
		if h.over {
			remaining = 0
			reset = retryAfter(h.est, uint32(min(uint64(h.hits)*uint64(l.unit), uint64(h.theta))), h.theta, now, l.tick)
			if !h.ru.cfg.Shadow {
				dst.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				retry = max(retry, reset)
			}
		}
		dst.LimitRemaining = uint32(max(remaining, 0))
		dst.DurationUntilReset = durationpb.New(reset)
		if h.ru.cfg.Shadow {
			continue // shadow descriptors send no fields
		}
		policies = append(policies, l.item)
		if allowed || h.over {
			field = appendItem(field, l.quoted, int64(dst.LimitRemaining), seconds(reset))
		}
	}
	if len(policies) > 0 && !st.cfg.Headers.Off {
		add := func(k, v string) {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
		}
		add("RateLimit-Policy", strings.Join(policies, ", "))
		add("RateLimit", string(field))
		if !allowed {
			add("Retry-After", strconv.FormatInt(seconds(retry), 10))
		}
	}
	if !allowed {
		m.met.rlsOverLimit.Add(1)
	}
	return resp, nil
}
