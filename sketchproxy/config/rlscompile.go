package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v4"

	"github.com/epochsketch/epochsketch/rate"
)

// validateEnvoyRLS loads and compiles the domains.
func (c *Config) validateEnvoyRLS(b *RLS) error {
	r := c.EnvoyRLS
	if r == nil {
		return nil
	}
	if r.Listen == "" {
		return c.errAt(`missing: the gRPC address, e.g. listen: "127.0.0.1:8081"`, "envoy_rls", "listen")
	}
	if err := checkAddr(r.Listen); err != nil {
		return c.errAt(err.Error(), "envoy_rls", "listen")
	}
	switch r.ResponseHeaders = strings.ToLower(r.ResponseHeaders); r.ResponseHeaders {
	case "":
		r.ResponseHeaders = RLSHeadersNone
	case RLSHeadersNone, RLSHeadersRateLimit, RLSHeadersDraft:
	default:
		return c.errAt(fmt.Sprintf("%q: want none (the default), ratelimit (envoyproxy/ratelimit's RateLimit-Limit, -Remaining and -Reset) or draft (RateLimit-Policy and RateLimit)", r.ResponseHeaders), "envoy_rls", "response_headers")
	}
	switch r.Refused {
	case "":
		r.Refused = "free"
	case "free", "count":
	default:
		return c.errAt(fmt.Sprintf("%q: want free (a refused call counts nothing) or count (every hit counts, as envoyproxy/ratelimit)", r.Refused), "envoy_rls", "refused")
	}
	if err := orNone(c, &r.MaxConnectionAge, Duration(24*time.Hour), "envoy_rls", "max_connection_age"); err != nil {
		return err
	}
	if err := orNone(c, &r.MaxConnectionAgeGrace, Duration(time.Hour), "envoy_rls", "max_connection_age_grace"); err != nil {
		return err
	}
	if err := r.prepareConnections(c); err != nil {
		return err
	}
	*b = RLS{merge: r.MergeDomains, count: r.Refused == "count", domains: map[string]*RLSNode{}}
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

// prepareConnections applies the listener's bounds' defaults and checks
// them.
func (r *EnvoyRLSConfig) prepareConnections(c *Config) error {
	if r.ConnectionTimeout == 0 {
		r.ConnectionTimeout = Duration(5 * time.Second)
	}
	if r.ConnectionTimeout < Duration(100*time.Millisecond) || r.ConnectionTimeout > Duration(5*time.Minute) {
		return c.errAt("want 100ms to 5m", "envoy_rls", "connection_timeout")
	}
	if err := orNone(c, &r.MaxConnectionIdle, Duration(15*time.Minute), "envoy_rls", "max_connection_idle"); err != nil {
		return err
	}
	if r.MaxConnections < 0 || r.MaxConnections > 1<<24 {
		return c.errAt(fmt.Sprintf("%d: want 0 (a quarter of the file descriptor limit) to 2^24", r.MaxConnections), "envoy_rls", "max_connections")
	}
	if r.MaxConnectionsPerClient == nil {
		r.MaxConnectionsPerClient = ptr(256)
	}
	if n := *r.MaxConnectionsPerClient; n < 0 || n > 1<<24 {
		return c.errAt(fmt.Sprintf("%d: want 0 (no cap) to 2^24", n), "envoy_rls", "max_connections_per_client")
	}
	return nil
}

// parseRLSFile reads an envoyproxy/ratelimit configuration file: unknown
// fields are errors with the file and line.
func parseRLSFile(name string, data []byte) (*Config, *RLSDomain, error) {
	if err := notUTF8(name, data); err != nil {
		return nil, nil, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, yamlError(name, err, nil, nil, data)
	}
	var d RLSDomain
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&d); errors.Is(err, io.EOF) {
		return nil, nil, &Error{File: name, Msg: "the file is empty: want domain: and descriptors:"}
	} else if err != nil {
		return nil, nil, yamlError(name, err, &root, reflect.TypeFor[RLSDomain](), data)
	}
	return &Config{src: name, root: &root}, &d, nil
}

// compile adds domain d, found at path in c's document, to r.
func (r *RLS) compile(c *Config, d *RLSDomain, path ...any) error {
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
	var walk func(n *RLSNode, ds []RLSDescriptor, names []string, path []any) error
	walk = func(n *RLSNode, ds []RLSDescriptor, names []string, path []any) error {
		for i := range ds {
			dd := &ds[i]
			p := append(cloneAnys(path), "descriptors", i)
			if dd.Key == "" {
				return c.errAt("missing: every descriptor needs a key", append(p, "key")...)
			}
			child, err := n.add(c, dd, p)
			if err != nil {
				return err
			}
			if dd.ShareThreshold && !strings.HasSuffix(dd.Value, "*") {
				return c.errAt(fmt.Sprintf("share_threshold needs a wildcard value, one ending in * (as envoyproxy/ratelimit), not %q", dd.Value), append(p, "share_threshold")...)
			}
			child.detailed = dd.DetailedMetric || dd.ValueToMetric
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
				if err := r.limit(c, child, dd, d.Domain, printable("envoy:"+d.Domain+":"+strings.Join(names, ":")), append(p, "rate_limit")); err != nil {
					return err
				}
			}
			if child.detailed && child.rule >= 0 {
				if r.detailed == nil {
					r.detailed = map[string]bool{}
				}
				r.detailed[r.rules[child.rule].Name] = true
			}
			if err := walk(child, dd.Descriptors, names, p); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(root, d.Descriptors, nil, path)
}

// add gives n a child for descriptor dd, found at path p: a key without a
// value, a wildcard value or an exact one. Each may appear once per level.
func (n *RLSNode) add(c *Config, dd *RLSDescriptor, p []any) (*RLSNode, error) {
	child := newRLSNode()
	twice := func() error {
		return c.errAt(fmt.Sprintf("%s=%s is given twice at this level", dd.Key, dd.Value), p...)
	}
	switch v := dd.Value; {
	case v == "":
		if n.any[dd.Key] != nil {
			return nil, c.errAt(fmt.Sprintf("key %q without a value is given twice at this level", dd.Key), p...)
		}
		n.any[dd.Key] = child
	case strings.HasSuffix(v, "*"):
		// Only a trailing * is a wildcard, as in envoyproxy/ratelimit (its
		// wildcardKeys): any other * is a literal byte of an exact value,
		// so that a file means what it means there.
		for _, w := range n.wild {
			if w.key == dd.Key && w.n.pattern == v {
				return nil, twice()
			}
		}
		child.pattern, child.prefix, child.share = v, strings.TrimSuffix(v, "*"), dd.ShareThreshold
		n.wild = append(n.wild, rlsWild{dd.Key, child})
	default:
		k := [2]string{dd.Key, v}
		if n.exact[k] != nil {
			return nil, twice()
		}
		n.exact[k] = child
	}
	return child, nil
}

// limit compiles descriptor dd's rate_limit of domain, at path p, into
// node n: a rule named name for a counted limit.
func (r *RLS) limit(c *Config, n *RLSNode, dd *RLSDescriptor, domain, name string, p []any) error {
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
		// As envoyproxy/ratelimit ("should not specify rate limit unit when
		// unlimited"): a unit says the writer meant a limit.
		if _, ok := rlsUnits[strings.ToLower(rl.Unit)]; ok {
			return c.errAt(fmt.Sprintf("%q with unlimited: true: remove the unit, or unlimited for a limit of requests_per_unit per %s", rl.Unit, strings.ToLower(rl.Unit)), append(p, "unit")...)
		}
		n.limit = RLSUnlimited
		return nil
	}
	u, ok := rlsUnits[strings.ToLower(rl.Unit)]
	if !ok {
		return c.errAt(fmt.Sprintf("%q: want second, minute, hour, day, week, month or year", rl.Unit), append(p, "unit")...)
	}
	if rl.RequestsPerUnit != math.Trunc(rl.RequestsPerUnit) || rl.RequestsPerUnit < 0 || rl.RequestsPerUnit > rate.MaxBurstHalving {
		return c.errAt(fmt.Sprintf("%g: want a whole number from 0 (refuse every request) to %d", rl.RequestsPerUnit, rate.MaxBurstHalving), append(p, "requests_per_unit")...)
	}
	if rl.RequestsPerUnit == 0 && c.root != nil && !c.given(append(p, "requests_per_unit")...) {
		return c.errAt("missing: requests_per_unit (write 0 to refuse every request)", p...)
	}
	n.unit, n.requests = u.u, uint32(rl.RequestsPerUnit)
	rule := Rule{Shadow: dd.ShadowMode, Refused: "free"}
	if r.count {
		rule.Refused = "count"
	}
	// The policy's name in the draft's fields: the limit's own name, or
	// its unit; never the descriptor's keys and values. Unique in its
	// domain, as the HTTP rules' limit names are in a rule: two limits
	// called per-minute in one response would be one policy to a client,
	// so the second is per-minute-2.
	rule.policy = r.policyName(domain, rl.Name, rl.Unit)
	if rl.RequestsPerUnit == 0 {
		n.limit, rule.block = RLSBlock, true // every hit is over
	} else {
		// requests_per_unit per unit, with package rate's default burst
		// (as many at once): the same words mean the same limit as a
		// rule's requests and per.
		lim := Limit{Name: "limit", Requests: rl.RequestsPerUnit, Per: Duration(u.d)}
		rl, err := compileRate(lim.rate(), func(msg, _ string) error { return c.errAt(msg, p...) })
		if err != nil {
			return err
		}
		lim.Burst = float64(rl.Burst)
		n.limit = RLSLimited
		rule.Limits = []Limit{lim}
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

// policyName is the name in the draft's fields of a limit called name
// (or, unnamed, per-unit), unique in its domain: the first free of base,
// base-2, base-3, ...
func (r *RLS) policyName(domain, name, unit string) string {
	base := printable(name)
	if base == "" {
		base = "per-" + strings.ToLower(unit)
	}
	if r.policies == nil {
		r.policies = map[string]map[string]bool{}
	}
	taken := r.policies[domain]
	if taken == nil {
		taken = map[string]bool{}
		r.policies[domain] = taken
	}
	policy := base
	for i := 2; taken[policy]; i++ {
		policy = base + "-" + strconv.Itoa(i)
	}
	taken[policy] = true
	return policy
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
