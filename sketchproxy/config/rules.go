package config

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// Rule matches requests and limits them by key.
type Rule struct {
	// Name names the rule in metrics, logs and the RateLimit fields:
	// letters, digits, - and _, unique among the rules. Unnamed rules are
	// rule1, rule2, ... by their place in the list.
	Name string `yaml:"name" example:"per-client"`
	// Match selects the requests the rule applies to.
	Match Match `yaml:"match"`
	// Key lists the parts of a request's key, joined with "|": "ip" (the
	// client address, grouped by client_ip's prefixes), "header:NAME",
	// "query:NAME", or "jwt:CLAIM", a claim of the bearer token the jwt
	// section verifies (a missing or invalid token is refused with 401).
	// A missing header or parameter is the part "-": every
	// client that sends none shares the one key "-" (or "-|..." beside
	// other parts), and so its limit; give such clients a rule keyed on ip
	// too.
	Key []string `yaml:"key" example:"[ip, header:X-API-Key]"`
	// Allow exempts clients from this rule, with no sketch work.
	Allow AllowList `yaml:"allow"`
	// Limits: every one must allow the request.
	Limits []Limit `yaml:"limits"`
	// Shadow decides, logs and counts, but lets every request through.
	Shadow bool `yaml:"shadow" example:"true"`
	// Tarpit applies the tarpit section's ladder; without it, over the
	// limit is a 429.
	Tarpit bool `yaml:"tarpit" example:"true"`
	// Budget is a wallet: a cost per request, reconciled from the upstream.
	Budget *Budget `yaml:"budget"`
	// Refused says whether requests this rule's limits refuse count
	// against them: "free" (the default without tarpit) counts only the
	// requests the proxy lets through, so a client over the limit still
	// gets the limit, as with nginx limit_req or a token bucket; "count"
	// (the default, and the only choice, with tarpit) counts every attempt,
	// so a client that keeps hammering stays refused until it slows down:
	// the punitive mode for abuse, and what the tarpit's ladder grades.
	Refused string `yaml:"refused" example:"count"`
	// MaxInFlight caps one key's requests in progress (streams), up to
	// 65536; 0 is none, except with a budget, where the default, 8,
	// bounds what requests in flight can overspend (see Budget.Reserve).
	// Each key's count is exact: keys a client invents never take
	// another key's places.
	MaxInFlight int `yaml:"max_in_flight" example:"4"`

	block  bool   // every hit is over: Envoy's requests_per_unit: 0
	policy string // the limits' name in the RateLimit fields, if not rule-limit
}

// Match selects requests; empty fields match everything.
type Match struct {
	// Host is the host the request names, exact and in any case; a port
	// and a trailing dot are ignored.
	Host string `yaml:"host" example:"api.example.com"`
	// PathPrefix matches the cleaned path (docs/rules-and-limits.md, Paths). One
	// that ends in "/" matches by segments: "/v1/" matches /v1, /v1/ and
	// /v1/x, not /v1x. Letters match in any case unless CaseSensitive.
	PathPrefix string `yaml:"path_prefix" example:"/v1/"`
	// CaseSensitive makes PathPrefix match letters only in their own case.
	CaseSensitive bool `yaml:"case_sensitive" example:"true"`
	// Methods are the request methods matched, in capitals; a HEAD matches
	// wherever GET does, and a POST also as the method its
	// X-HTTP-Method-Override, X-HTTP-Method or X-Method-Override header or
	// _method query parameter names (frameworks route it as that).
	Methods []string `yaml:"methods" example:"[GET, POST]"`
}

// AllowList lists clients a rule skips.
type AllowList struct {
	// CIDRs are the client networks (10.0.0.0/8) and single addresses
	// the rule skips.
	CIDRs []string `yaml:"cidrs" example:"[10.0.0.0/8]"`
	// Keys are whole keys, as built from Rule.Key, that the rule skips.
	Keys []string `yaml:"keys" example:"[internal-batch]"`
}

// AllowSet is a rule's allow list, compiled: the doors skip the rule for
// a client whose address is in one of CIDRs, or whose key is one of Keys.
// It is read only.
type AllowSet struct {
	CIDRs []netip.Prefix
	Keys  map[string]bool
}

// ruleAt reports a problem in rules[i], at path below it.
type ruleAt func(msg string, path ...any) error

// prepareRules checks every rule, in order, with its defaults applied.
func (c *Config) prepareRules(b *Built) error {
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

// validateRule applies rules[i]'s defaults and checks it; names holds the
// names of the rules before it, by index.
func (c *Config) validateRule(b *Built, i int, names map[string]int) error {
	r := &c.Rules[i]
	at := ruleAt(func(msg string, path ...any) error { return c.errAt(msg, append([]any{"rules", i}, path...)...) })
	if err := r.prepareName(at, i, names); err != nil {
		return err
	}
	if err := r.Match.prepare(at); err != nil {
		return err
	}
	if err := r.prepareKey(at, c.JWT != nil); err != nil {
		return err
	}
	allow, err := r.Allow.compile(at)
	if err != nil {
		return err
	}
	b.allow = append(b.allow, allow)
	if len(r.Limits) == 0 && r.Budget == nil && r.MaxInFlight == 0 {
		return at("the rule limits nothing: give it limits, a budget or max_in_flight", "limits")
	}
	if err := r.prepareLimits(at); err != nil {
		return err
	}
	if r.Budget != nil {
		if err := r.Budget.prepare(c, at, i); err != nil {
			return err
		}
		if r.MaxInFlight == 0 {
			r.MaxInFlight = 8 // bounds the overspend of requests in flight (see Reserve)
		}
	}
	if err := r.prepareRefused(at); err != nil {
		return err
	}
	if r.MaxInFlight < 0 || r.MaxInFlight > 1<<16 {
		return at(fmt.Sprintf("%d: want 0 (none) to 65536", r.MaxInFlight), "max_in_flight")
	}
	return nil
}

// prepareName names an unnamed rule rule1, rule2, ... by its place, and
// checks that the name is usable and unique.
func (r *Rule) prepareName(at ruleAt, i int, names map[string]int) error {
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
	return nil
}

// prepare checks the match and canonicalizes its host.
func (m *Match) prepare(at ruleAt) error {
	if p := m.PathPrefix; p != "" && !strings.HasPrefix(p, "/") {
		return at(fmt.Sprintf("%q: a path prefix starts with /", p), "match", "path_prefix")
	} else if p != "" && httpnorm.CleanPath(p) != p {
		return at(fmt.Sprintf("%q: requests are matched on cleaned paths, so this prefix would never match: write %q", p, httpnorm.CleanPath(p)), "match", "path_prefix")
	}
	if h := m.Host; h != "" {
		_, name, ok := httpnorm.CanonicalHost(h)
		if !ok || strings.HasPrefix(name, "[") != strings.HasPrefix(h, "[") {
			return at(fmt.Sprintf("%q: want a host name such as api.example.com (any case; a port or trailing dot is ignored)", h), "match", "host")
		}
		m.Host = name
	}
	for j, mt := range m.Methods {
		if mt == "" || strings.ToUpper(mt) != mt || strings.ContainsAny(mt, " \t/") {
			return at(fmt.Sprintf("%q: write methods in capitals, e.g. GET", mt), "match", "methods", j)
		}
	}
	return nil
}

// prepareKey applies the default key, [ip], and checks every part; a
// jwt:CLAIM part needs a jwt section (haveJWT).
func (r *Rule) prepareKey(at ruleAt, haveJWT bool) error {
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
			if !haveJWT {
				return at(fmt.Sprintf("%q needs a jwt section to verify tokens with", k), "key", j)
			}
			continue
		}
		if k != "ip" && (!ok || name == "") {
			return at(fmt.Sprintf("%q: want ip, header:NAME, query:NAME or jwt:CLAIM", k), "key", j)
		}
	}
	return nil
}

// compile parses the allow list's CIDRs and indexes its keys.
func (a *AllowList) compile(at ruleAt) (AllowSet, error) {
	allow := AllowSet{Keys: make(map[string]bool, len(a.Keys))}
	for j, s := range a.CIDRs {
		p, err := parsePrefix(s)
		if err != nil {
			return allow, at(err.Error(), "allow", "cidrs", j)
		}
		allow.CIDRs = append(allow.CIDRs, p)
	}
	for _, k := range a.Keys {
		allow.Keys[k] = true
	}
	return allow, nil
}

// prepareRefused applies the default of refused, which follows tarpit.
func (r *Rule) prepareRefused(at ruleAt) error {
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
	return nil
}

// spec is the prepared rule as the engine compiles it.
func (r *Rule) spec() engine.RuleSpec {
	rs := engine.RuleSpec{Name: r.Name, Shadow: r.Shadow, Tarpit: r.Tarpit, CountRefused: r.Refused == "count", MaxInFlight: r.MaxInFlight, Block: r.block}
	for _, l := range r.Limits {
		rs.Limits = append(rs.Limits, engine.LimitSpec{Name: l.Name, Policy: r.policy, Rate: l.rate()})
	}
	if b := r.Budget; b != nil {
		rs.Budget = b.spec()
	}
	return rs
}
