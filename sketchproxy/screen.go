package sketchproxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/jwtauth"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/keysrc"
)

// The door's screening: what it reads from a request before the engine
// decides (its path, Host, client address and methods, the rules that
// match it and its key under each), and the requests it refuses because
// no rule could judge them safely. Everything a rule needs per request is
// compiled at install (matcher), so a request reads only the door's own
// values.

// screen refuses what no rule can judge safely (an ambiguous path or key,
// 400; a key that needs a valid bearer token, 401), cleans the path, finds
// the client into rq, and appends the rules that match to matched. It
// returns false when it has answered the request.
func (m *Middleware) screen(w http.ResponseWriter, r *http.Request, st *state, rq *request, alt []string, matched []*rule) ([]*rule, bool) {
	switch {
	case r.Method == http.MethodConnect || r.Method == http.MethodTrace:
		// CONNECT opens a tunnel no rule can judge; TRACE echoes a
		// request's headers, cookies included, back to a script (nginx
		// refuses both).
		m.refuse(w, r, st, nil, refusal{code: http.StatusMethodNotAllowed, why: r.Method + ": this is a reverse proxy; it forwards neither tunnels nor traces",
			header: "Allow", value: "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"})
		return nil, false
	case strings.ToUpper(r.Method) != r.Method:
		// Methods are case-sensitive, but some upstreams (Werkzeug, for
		// one) serve "get" as GET: no rule could tell. nginx answers 400 too.
		m.refuse(w, r, st, nil, refusal{code: http.StatusBadRequest, why: fmt.Sprintf("the method %.32q is not in upper case", r.Method)})
		return nil, false
	}
	if why := httpnorm.PathProblem(r); why != "" {
		m.refuse(w, r, st, nil, refusal{code: http.StatusBadRequest, why: why})
		return nil, false
	}
	host, name, ok := httpnorm.CanonicalHost(r.Host)
	if !ok {
		m.refuse(w, r, st, nil, refusal{code: http.StatusBadRequest, why: fmt.Sprintf("the Host %.64q is not a host name or address with at most one port", r.Host)})
		return nil, false
	}
	httpnorm.NormalizePath(r)
	r.Host = host // what rules judged is what the upstream is sent
	*rq = request{r: r, addr: st.ci.clientAddr(r), host: name, path: r.URL.Path, alt: alt}
	if rq.path == "*" {
		rq.path = "/" // OPTIONS *: the server as a whole
	}
	rq.loose = httpnorm.LoosePath(rq.path)
	rq.methods = httpnorm.MethodsOf(r)
	rq.sc = scratchPool.Get().(*engine.Scratch)
	for _, ru := range st.rules {
		if !ru.matches(rq) {
			continue
		}
		if why := ru.ambiguous(r); why != "" {
			rq.free()
			m.refuse(w, r, st, nil, refusal{code: http.StatusBadRequest, why: why})
			return nil, false
		}
		if ru.needJWT && !m.verifyJWT(w, r, st, ru, rq) {
			rq.free()
			return nil, false
		}
		matched = append(matched, ru)
	}
	return matched, true
}

// request holds what one request needs across rules.
type request struct {
	r *http.Request
	// host is the canonical Host without its port ("" when the request
	// has none); alt, for a forward-auth check whose gateway is not named,
	// the other hosts its headers give. path is the cleaned path rules
	// match ("/" for "OPTIONS *"), loose its folded form (httpnorm.LoosePath).
	host, path, loose string
	alt               []string
	addr              netip.Addr
	// client is addr grouped by prefix: the key part "ip", and the
	// per-client cap's key.
	client  string
	methods httpnorm.Methods // what rules with methods match (MethodsOf)
	claims  jwtauth.Claims   // the verified bearer token's, once a rule needs them
	sc      *engine.Scratch  // from scratchPool; nil once freed
	// refusal, if not 0, is the status of every refusal: a forward-auth
	// check's (ForwardAuthConfig.RefusalStatus).
	refusal int
}

var scratchPool = sync.Pool{New: func() any { return new(engine.Scratch) }}

// free returns the request's key buffer to the pool.
func (rq *request) free() {
	if rq.sc != nil {
		rq.sc.Reset()
		scratchPool.Put(rq.sc)
		rq.sc = nil
	}
}

// clientAddr finds the client's address (package clientip, Walk). The
// connection's peer is the client unless it is a trusted proxy; then the
// one configured source (X-Forwarded-For by default) is read from the
// right, skipping trusted hops, and the first untrusted address is the
// client: what lies left of it was written by the client and is never
// believed. Every other forwarding header is ignored, so a client cannot
// choose its key by sending one the load balancer does not overwrite.
func (ci *clientIP) clientAddr(r *http.Request) netip.Addr {
	peer := clientip.ParseAddr(r.RemoteAddr)
	if !peer.IsValid() || !ci.trusted.Contains(peer) {
		return peer
	}
	f := clientip.XForwardedFor
	if ci.Source == sourceForwarded {
		f = clientip.Forwarded
	}
	return clientip.Walk(peer, r.Header.Values(ci.header), f, ci.trusted.Contains)
}

// group maps an address to its client key, the key part "ip": IPv6 by /64
// (by default), IPv4 by /32 (clientip.Key); "unknown" for an invalid
// address (a peer that is not an IP address).
func (ci *clientIP) group(a netip.Addr) string {
	if !a.IsValid() {
		return "unknown"
	}
	return clientip.Key(a, ci.IPv4Prefix, ci.IPv6Prefix)
}

// rule is a compiled rule with what the HTTP doors need to match a request
// and build its key.
type rule struct {
	eng     *engine.Rule
	cfg     *Rule
	allow   config.AllowSet // the rule's allow list, compiled by config.Build
	methods map[string]bool
	key     []keyPart
	// keyHeaders and keyQueries are the key's header:NAME (canonical) and
	// query:NAME parts, checked for ambiguity.
	keyHeaders, keyQueries []string
	needJWT                bool // a key part is a claim of the bearer token
	latency                prometheus.Observer
}

// keyPart is one part of a rule's key (Rule.Key), parsed at install.
type keyPart struct {
	from keySource
	// name is the header's (canonical), the query parameter's or the
	// claim's.
	name string
	// credentials: the header holds credentials, read as keysrc reads
	// them ("bearer abc" is "Bearer  abc").
	credentials bool
}

// keySource is where a key part is read from.
type keySource uint8

const (
	fromIP     keySource = iota // "ip": the client, grouped (clientIP.group)
	fromHeader                  // "header:NAME"
	fromQuery                   // "query:NAME"
	fromClaim                   // "jwt:CLAIM"
)

// matcher is rc as the HTTP doors match it, deciding through ru, with its
// allow list allow.
func (m *Middleware) matcher(rc *Rule, allow *config.AllowSet, ru *engine.Rule) *rule {
	r := &rule{eng: ru, cfg: rc, allow: *allow, latency: m.observer(rc.Name)}
	if len(rc.Match.Methods) > 0 {
		r.methods = map[string]bool{}
		for _, mt := range rc.Match.Methods {
			r.methods[mt] = true
		}
		// A HEAD is a GET without the body: upstreams (Go's, nginx's
		// limit_except) serve it with the GET handler.
		r.methods[http.MethodHead] = r.methods[http.MethodHead] || r.methods[http.MethodGet]
	}
	for _, k := range rc.Key {
		p := keyPart{from: fromIP} // config.Build has checked every part
		if name, ok := strings.CutPrefix(k, "header:"); ok {
			p = keyPart{from: fromHeader, name: http.CanonicalHeaderKey(name)}
			p.credentials = keysrc.IsCredentials(p.name)
			r.keyHeaders = append(r.keyHeaders, p.name)
		}
		if name, ok := strings.CutPrefix(k, "query:"); ok {
			p = keyPart{from: fromQuery, name: name}
			r.keyQueries = append(r.keyQueries, name)
		}
		if name, ok := strings.CutPrefix(k, "jwt:"); ok {
			p = keyPart{from: fromClaim, name: name}
			r.needJWT = true
		}
		r.key = append(r.key, p)
	}
	return r
}

func (ru *rule) matches(rq *request) bool {
	mt := &ru.cfg.Match
	if mt.Host != "" && !rq.hostIs(mt.Host) {
		return false
	}
	if p := mt.PathPrefix; p != "" && !httpnorm.PathMatch(rq.path, p, mt.CaseSensitive) &&
		(rq.loose == rq.path || !httpnorm.PathMatch(rq.loose, p, mt.CaseSensitive)) {
		return false
	}
	return ru.methods == nil || rq.methods.In(ru.methods)
}

// hostIs reports whether a host rule for h applies: the request names h,
// or names no host at all (an HTTP/1.0 request without Host reaches the
// upstream's default host, which may be h).
func (rq *request) hostIs(h string) bool {
	if rq.host == h || rq.host == "" && len(rq.alt) == 0 {
		return true
	}
	for _, a := range rq.alt {
		if a == h {
			return true
		}
	}
	return false
}

// ambiguous says why a request's key cannot be read the way every upstream
// would read it, or "": a key header sent twice (the proxy would count one
// value and the upstream might use the other), or a header whose name
// differs from a key header only by '_' for '-' or by case (CGI, WSGI and
// Rack servers read X_API_Key as X-API-Key; nginx drops it). Query keys
// given twice are ambiguous the same way.
func (ru *rule) ambiguous(r *http.Request) string {
	for _, name := range ru.keyHeaders {
		if n := len(r.Header.Values(name)); n > 1 {
			return fmt.Sprintf("the key header %s is sent %d times", name, n)
		}
	}
	if len(ru.keyHeaders) > 0 {
		for h := range r.Header {
			if !strings.Contains(h, "_") {
				continue
			}
			alias := http.CanonicalHeaderKey(strings.ReplaceAll(h, "_", "-"))
			for _, name := range ru.keyHeaders {
				if alias == name {
					return fmt.Sprintf("the header %q reads as the key header %s to some upstreams", truncate(h, 64), name)
				}
			}
		}
	}
	for _, name := range ru.keyQueries {
		if n := len(keysrc.Query(r.URL.RawQuery, name)); n > 1 {
			return fmt.Sprintf("the key parameter %q is given %d times", name, n)
		}
	}
	return ""
}

// keyOf is the request's key under the rule: its parts joined with "|".
func (ru *rule) keyOf(rq *request) string {
	if len(ru.key) == 1 {
		return rq.part(&ru.key[0])
	}
	var b strings.Builder
	for i := range ru.key {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(rq.part(&ru.key[i]))
	}
	return b.String()
}

// part is the request's value of one key part, "-" where it has none.
func (rq *request) part(p *keyPart) string {
	switch p.from {
	case fromIP:
		return rq.client
	case fromHeader:
		if v := rq.r.Header.Get(p.name); v != "" {
			if p.credentials {
				return keysrc.Credentials(v) // "bearer abc" is "Bearer  abc"
			}
			return v
		}
	case fromQuery:
		// Every spelling an application reads as the name ("api.key" to
		// PHP), with ';' a separator too: ambiguous has refused two.
		if vs := keysrc.Query(rq.r.URL.RawQuery, p.name); len(vs) > 0 && vs[0] != "" {
			return vs[0]
		}
	case fromClaim:
		if v, err := rq.claims.Part(p.name); err == nil {
			return v // ServeHTTP has checked every claim a matched rule needs
		}
	}
	return "-"
}

// allowlisted reports whether the rule's allow list exempts a client at
// addr (invalid when unknown) whose key is key.
func (ru *rule) allowlisted(addr netip.Addr, key string) bool {
	// Short enough to be inlined: a request asks every rule that matches
	// it, most with no cidrs.
	return len(ru.allow.CIDRs) > 0 && ru.allowsAddr(addr) || ru.allow.Keys[key]
}

// allowsAddr reports whether addr is in one of the allow list's cidrs. It
// stays a call of its own, so that allowlisted is inlined.
//
//go:noinline
func (ru *rule) allowsAddr(addr netip.Addr) bool {
	if addr.IsValid() {
		for _, p := range ru.allow.CIDRs {
			if p.Contains(addr) {
				return true
			}
		}
	}
	return false
}

// verifyJWT verifies the request's bearer token once and checks the claims
// ru's key needs; it answers 401 and reports false if they are not there.
func (m *Middleware) verifyJWT(w http.ResponseWriter, r *http.Request, st *state, ru *rule, rq *request) bool {
	c, err := st.jwt.Check(r, rq.claims, ru.cfg.Key)
	if err != nil {
		m.refuse(w, r, st, nil, unauthorized(err))
		return false
	}
	rq.claims = c
	return true
}

// unauthorized is the answer to a request whose rule needs a verified
// token it does not carry, for err (RFC 6750, section 3).
func unauthorized(err error) refusal {
	if errors.Is(err, jwtauth.ErrNoToken) {
		return refusal{code: http.StatusUnauthorized, why: "this route counts requests per verified identity: send a bearer token",
			header: "WWW-Authenticate", value: `Bearer realm="sketchproxy"`}
	}
	desc := strings.NewReplacer(`"`, "'", `\`, "/").Replace(truncate(err.Error(), 200))
	return refusal{code: http.StatusUnauthorized, why: "the bearer token is not valid: " + desc,
		header: "WWW-Authenticate", value: `Bearer realm="sketchproxy", error="invalid_token", error_description="` + desc + `"`}
}
