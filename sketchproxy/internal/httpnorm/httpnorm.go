// Package httpnorm reads a request's path and Host the one way every door
// matches them and the upstream is sent them: cleaned, canonical, and
// refused where upstreams disagree on what they name.
package httpnorm

import (
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/keysrc"
)

// Paths: rules match the path the upstream will serve, and the upstream is
// sent that same path, so no spelling of a path reaches it past a rule.
//
// A request's path is decoded (Go's URL parser does that: %61pi is api)
// and cleaned: repeated slashes merge, "." segments go, ".." segments
// remove the one before and never climb above the root, and a trailing
// slash stays. The cleaned path is what rules match and what the upstream
// receives. Encodings that upstreams disagree on are refused with 400
// before any rule runs: an encoded slash (%2F) or backslash (%5C), a
// backslash, NUL or any other control byte, a dot segment with parameters
// ("/..;/", which Java servers read as ".."), and a path that is not a path
// (no leading slash, except "*" for OPTIONS, which rules for "/" judge where
// a server passes it on at all: Go's answers it itself). Spellings that only
// some upstreams fold onto another path, segment parameters
// ("/api;jsessionid=1/x" is /api/x to Tomcat), NTFS stream names and
// trailing dots and spaces ("/api::$DATA/x" and "/api./x" are /api/x to
// IIS), are forwarded as sent, and rules match both the path and its folded
// form (LoosePath).

// PathProblem says why a request's path is refused, or "" if it is fine.
func PathProblem(r *http.Request) string {
	p := r.URL.Path
	if p == "" || p[0] != '/' {
		if r.Method == http.MethodOptions && p == "*" {
			return ""
		}
		return "the path must start with /"
	}
	raw := r.URL.EscapedPath()
	for i := 0; i+2 < len(raw); i++ {
		if raw[i] != '%' {
			continue
		}
		switch strings.ToUpper(raw[i+1 : i+3]) {
		case "2F":
			return "an encoded slash (%2F) in the path"
		case "5C":
			return "an encoded backslash (%5C) in the path"
		}
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			return "a backslash in the path"
		case c < 0x20 || c == 0x7f:
			return "a control byte in the path"
		case c == ';' && i >= 2 && p[i-1] == '.' && (p[i-2] == '/' || p[i-2] == '.' && i >= 3 && p[i-3] == '/'):
			// "/..;/" is ".." to Tomcat and Jetty, a plain name to a cleaner.
			return "a dot segment with parameters (/.;/ or /..;/) in the path"
		}
	}
	return ""
}

// CleanPath is p with repeated slashes merged and "." and ".." resolved,
// keeping a trailing slash: what a file server or router serves for p.
func CleanPath(p string) string {
	if p == "" || p[0] != '/' {
		return p
	}
	c := path.Clean(p)
	if c != "/" && (strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")) {
		c += "/"
	}
	return c
}

// NormalizePath rewrites r's path to its cleaned form, keeping the
// client's percent-encoding where it still spells the same path.
func NormalizePath(r *http.Request) {
	p := r.URL.Path
	if p == "" || p[0] != '/' {
		return
	}
	c := CleanPath(p)
	if c == p {
		return
	}
	raw := r.URL.RawPath
	r.URL.Path = c
	r.URL.RawPath = ""
	if raw != "" {
		// Without an encoded slash, raw and decoded paths have the same
		// segments; url.URL ignores a RawPath that does not decode to Path.
		r.URL.RawPath = CleanPath(raw)
	}
	if r.URL.EscapedPath() != r.URL.RawPath {
		r.URL.RawPath = ""
	}
}

// LoosePath is p as the most forgiving upstream reads it, or p itself:
// each segment's parameters cut (";jsessionid=1", which Tomcat and Jetty
// drop before they route) and its NTFS stream name (":" on, which IIS
// drops: "api::$DATA" is "api"), then its trailing dots and spaces (which
// IIS and Windows file systems drop), and the result cleaned. Rules match both
// spellings, so neither one slips past a rule (docs/rules-and-limits.md, Paths).
func LoosePath(p string) string {
	if p == "" || p[0] != '/' {
		return p
	}
	var b []byte // nil while p is unchanged
	start := 1
	for i := 1; i <= len(p); i++ {
		if i < len(p) && p[i] != '/' {
			continue
		}
		seg := p[start:i]
		cut := seg
		if j := strings.IndexAny(cut, ";:"); j >= 0 {
			cut = cut[:j] // ";jsessionid=1", and NTFS streams ("api::$DATA") to IIS
		}
		if t := strings.TrimRight(cut, " "); strings.Trim(t, ".") != "" {
			cut = strings.TrimRight(t, ". ")
		} else if t != "" {
			cut = t // "..." or ".. ": dots alone stay (".." is then resolved)
		}
		if b == nil && len(cut) != len(seg) {
			b = append(make([]byte, 0, len(p)), p[:start]...)
		}
		if b != nil {
			b = append(b, cut...)
			if i < len(p) {
				b = append(b, '/')
			}
		}
		start = i + 1
	}
	if b == nil {
		return p
	}
	return CleanPath(string(b))
}

// PathMatch reports whether a request path is under prefix. A prefix that
// ends in "/" matches by whole segments: "/api/" matches "/api", "/api/" and
// "/api/x", never "/apix". Without a trailing slash it is a plain prefix:
// "/api" matches "/apix" too. Unless caseSensitive, letters match in any
// case, because many upstreams (Windows, macOS file systems, some routers)
// serve /API/x as /api/x.
func PathMatch(p, prefix string, caseSensitive bool) bool {
	eq := strings.EqualFold
	if caseSensitive {
		eq = func(a, b string) bool { return a == b }
	}
	if len(p) >= len(prefix) && eq(p[:len(prefix)], prefix) {
		return true
	}
	dir := strings.TrimSuffix(prefix, "/")
	return len(dir) < len(prefix) && dir != "" && eq(p, dir)
}

// Hosts: a rule's host is matched against one canonical spelling of the
// request's Host, the one the upstream is then sent. A name is lower-cased
// and loses one trailing dot; an IPv6 address is written in its bracketed
// compressed form; one port may follow, written without leading zeros, and
// is ignored by the match. A
// Host that is none of these (a second port, "api.example.com:80:80", an
// empty label, a byte outside letters, digits, '-', '_' and '.') is refused
// with 400, because gateways and upstreams disagree on what it names.

// CanonicalHost returns h's canonical spelling and its name without the
// port, or ok false when h is not a valid Host. An empty h is valid: an
// HTTP/1.0 request may leave Host out.
func CanonicalHost(h string) (canon, name string, ok bool) {
	if h == "" {
		return "", "", true
	}
	if len(h) > 255+6 {
		return "", "", false
	}
	var port string
	if h[0] == '[' {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return "", "", false
		}
		a, err := netip.ParseAddr(h[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", "", false
		}
		name = "[" + a.String() + "]"
		rest := h[end+1:]
		if rest != "" {
			if rest[0] != ':' {
				return "", "", false
			}
			port = rest[1:]
		}
	} else {
		name = h
		if i := strings.IndexByte(h, ':'); i >= 0 {
			name, port = h[:i], h[i+1:]
		}
		name = strings.TrimSuffix(name, ".")
		if !validHostName(name) {
			return "", "", false
		}
		name = strings.ToLower(name)
	}
	if !validPort(port) {
		return "", "", false
	}
	if port != "" && (port[0] != '0' || port == "0") && len(h) == len(name)+1+len(port) && h[:len(name)] == name {
		return h, name, true // canonical already: no new string
	}
	canon = name
	if port != "" {
		n, _ := strconv.Atoi(port)
		canon += ":" + strconv.Itoa(n) // 0080 is 80
	}
	return canon, name, true
}

// validHostName reports whether s is a DNS name (or an IPv4 address):
// non-empty labels of letters, digits, '-' and '_'.
func validHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_':
			label++
			if label > 63 {
				return false
			}
		default:
			return false
		}
	}
	return label > 0
}

// validPort reports whether p is empty (no port, or "host:") or a port
// number up to 65535.
func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}

// MethodOverrideHeaders are the headers with which a POST asks a framework
// to route it as another method: Express's method-override, Laravel and
// Symfony read X-HTTP-Method-Override, others X-HTTP-Method or
// X-Method-Override. Rails, Laravel and Symfony also read a _method
// parameter (the query's is seen here; a form body's is not read).
var MethodOverrideHeaders = [...]string{"X-Http-Method-Override", "X-Http-Method", "X-Method-Override"}

// maxMethods is how many methods Methods lists; a request that names more
// matches every method (Methods.All).
const maxMethods = 8

// Methods are the methods a request is judged as, in capitals: its own;
// GET for a HEAD (which upstreams serve with the GET handler); and for a
// POST, every method an override header or the _method query parameter
// names, since a framework may route it as that. A POST with an override
// of DELETE thus matches both POST and DELETE limits: the safe direction.
// The zero value lists nothing.
type Methods struct {
	list [maxMethods]string
	n    int
	// All: the request names more than maxMethods methods, and matches
	// every method.
	All bool
}

// MethodsOf returns the methods r is judged as.
func MethodsOf(r *http.Request) Methods {
	var ms Methods
	ms.add(r.Method)
	if ms.list[0] != http.MethodPost {
		return ms
	}
	for _, h := range MethodOverrideHeaders {
		for _, v := range r.Header[h] {
			ms.addList(v)
		}
	}
	if q := r.URL.RawQuery; strings.Contains(q, "method") || strings.Contains(q, "%") {
		// Read only when it may hold _method (perhaps as %5Fmethod), under
		// every name PHP reads as _method (.method, [method, " _method").
		for _, v := range keysrc.Query(q, "_method") {
			ms.addList(v)
		}
	}
	return ms
}

// List returns the methods listed: with All, the first maxMethods of
// them.
func (ms *Methods) List() []string { return ms.list[:ms.n] }

// In reports whether any of the methods is in set, or ms is All.
func (ms *Methods) In(set map[string]bool) bool {
	if ms.All {
		return true
	}
	for _, m := range ms.list[:ms.n] {
		if set[m] {
			return true
		}
	}
	return false
}

// addList adds each method of a comma-separated list (how a header sent
// twice reaches a framework).
func (ms *Methods) addList(v string) {
	for part := range strings.SplitSeq(v, ",") {
		if m := strings.TrimSpace(part); ValidMethod(m) {
			ms.add(m)
		}
	}
}

// add adds m in capitals, and GET for HEAD.
func (ms *Methods) add(m string) {
	m = strings.ToUpper(m)
	ms.add1(m)
	if m == http.MethodHead {
		ms.add1(http.MethodGet)
	}
}

func (ms *Methods) add1(m string) {
	for _, x := range ms.list[:ms.n] {
		if x == m {
			return
		}
	}
	if ms.n == maxMethods {
		ms.All = true // and the list stays as it is
		return
	}
	ms.list[ms.n] = m
	ms.n++
}

// ValidMethod reports whether m is an HTTP token (RFC 9110, 5.6.2).
func ValidMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}
