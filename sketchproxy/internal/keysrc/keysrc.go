// Package keysrc reads key parts from a request the way the applications
// behind SketchProxy and the Caddy module read them, so that a spelling
// the application takes for the same credential is the same key.
package keysrc

import (
	"net/url"
	"strings"
)

// Credentials is an Authorization (or Proxy-Authorization) value as a key:
// the scheme in lower case and one space before the credentials. The
// scheme is case-insensitive and the space 1*SP (RFC 9110, section 11),
// so "bearer abc", "BEARER abc" and "Bearer  abc" are the one key
// "bearer abc"; the credentials are kept as sent (a token68 is
// case-sensitive).
func Credentials(v string) string {
	v = strings.Trim(v, " \t")
	i := strings.IndexAny(v, " \t")
	if i < 0 {
		return strings.ToLower(v)
	}
	return strings.ToLower(v[:i]) + " " + strings.TrimLeft(v[i:], " \t")
}

// IsCredentials reports whether the header (canonical) carries
// credentials with a scheme.
func IsCredentials(header string) bool {
	return header == "Authorization" || header == "Proxy-Authorization"
}

// Query returns the values of the query parameter name in the raw query,
// as any application may read them: pairs are split at '&' and at ';'
// (Python before 3.9.2, Tomcat's and Rails' older parsers; Go drops a pair
// holding ';' altogether), and a name counts when it is name spelled with
// '.' or ' ' for '_' (PHP reads "api.key" and "api key" as api_key). A
// key given more than once in any spelling is for the caller to refuse.
func Query(raw, name string) []string {
	var vals []string
	want := phpName(name)
	for raw != "" {
		var pair string
		if i := strings.IndexAny(raw, "&;"); i >= 0 {
			pair, raw = raw[:i], raw[i+1:]
		} else {
			pair, raw = raw, ""
		}
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		k, err := url.QueryUnescape(k)
		if err != nil {
			continue
		}
		if k != name && phpName(k) != want {
			continue
		}
		if v, err = url.QueryUnescape(v); err != nil {
			continue
		}
		vals = append(vals, v)
	}
	return vals
}

// phpName is a parameter's name as PHP stores it: '.' and ' ' become '_'.
func phpName(s string) string {
	// PHP's parameter names (main/php_variables.c): leading spaces
	// dropped, then a space or a dot becomes _, and so does the first [
	// that no ] closes (api[key is api_key; api[]=x is an array, which no
	// key is).
	s = strings.TrimLeft(s, " ")
	if i := strings.IndexByte(s, '['); i >= 0 && !strings.Contains(s[i:], "]") {
		s = s[:i] + "_" + s[i+1:]
	}
	return strings.NewReplacer(".", "_", " ", "_").Replace(s)
}

// PHPName is the name PHP gives a query parameter named s: what a PHP
// application (Laravel, Symfony) reads, so that a key or an override read
// under another spelling is not another key.
func PHPName(s string) string { return phpName(s) }
