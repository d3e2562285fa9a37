package sketchproxy

import (
	"errors"
	"net/http"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/jwtauth"
)

// unauthorized answers a request whose rule needs a verified token it does
// not carry (RFC 6750, section 3).
func (m *Middleware) unauthorized(w http.ResponseWriter, r *http.Request, err error) {
	m.met.unauthorized.Add(1)
	closeIfBody(w, r)
	if errors.Is(err, jwtauth.ErrNoToken) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sketchproxy"`)
		writeProblem(w, http.StatusUnauthorized, "this route counts requests per verified identity: send a bearer token")
		return
	}
	desc := strings.NewReplacer(`"`, "'", `\`, "/").Replace(truncate(err.Error(), 200))
	w.Header().Set("WWW-Authenticate", `Bearer realm="sketchproxy", error="invalid_token", error_description="`+desc+`"`)
	writeProblem(w, http.StatusUnauthorized, "the bearer token is not valid: "+desc)
}
