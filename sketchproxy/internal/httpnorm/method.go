package httpnorm

import (
	"net/http"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/keysrc"
)

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
