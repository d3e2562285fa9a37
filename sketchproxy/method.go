package sketchproxy

import (
	"net/http"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// How a request's methods are read lives in internal/httpnorm (method.go),
// which the Caddy module shares; these names keep this package's API.

// MethodOverrideHeaders are the headers with which a POST asks a framework
// to route it as another method: Express's method-override, Laravel and
// Symfony read X-HTTP-Method-Override, others X-HTTP-Method or
// X-Method-Override. Rails, Laravel and Symfony also read a _method
// parameter (the query's is seen here; a form body's is not read). It is
// a copy of the list MethodsOf reads.
var MethodOverrideHeaders = httpnorm.MethodOverrideHeaders

// Methods are the methods a request is judged as, in capitals: its own;
// GET for a HEAD (which upstreams serve with the GET handler); and for a
// POST, every method an override header or the _method query parameter
// names, since a framework may route it as that. A POST with an override
// of DELETE thus matches both POST and DELETE limits: the safe direction.
// List returns them (with All, the request named more than 8, and matches
// every method: the first 8); In reports whether any is in a set, or All.
// The zero value lists nothing.
type Methods = httpnorm.Methods

// MethodsOf returns the methods r is judged as.
func MethodsOf(r *http.Request) Methods { return httpnorm.MethodsOf(r) }
