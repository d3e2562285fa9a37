package sketchproxy

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// ForwardAuthConfig is the decision endpoint a gateway asks before it
// forwards a request (nginx auth_request, Caddy forward_auth, Traefik
// ForwardAuth). It proxies nothing: it answers 200 to allow, or refuses
// with RefusalStatus, Retry-After and the RateLimit fields, which the gateway
// passes to its client.
type ForwardAuthConfig struct {
	// Path is the endpoint's path (default "/check").
	Path string `yaml:"path"`
	// Listen, if set, serves the endpoint on its own address; empty serves
	// it on the main listener, where Path is then never proxied.
	Listen string `yaml:"listen"`
	// RefusalStatus is the status of every refusal (default 429). nginx's
	// auth_request accepts only 2xx, 401 and 403 from the check and turns
	// anything else into 500: give 403 there and map it back to 429 with
	// error_page (README, Use with your gateway).
	RefusalStatus int `yaml:"refusal_status"`
}

func (c *Config) validateForwardAuth() error {
	fa := c.ForwardAuth
	if fa == nil {
		return nil
	}
	if fa.Path == "" {
		fa.Path = "/check"
	}
	if fa.Path[0] != '/' || cleanPath(fa.Path) != fa.Path || strings.ContainsAny(fa.Path, "?#%") {
		return c.errAt(fmt.Sprintf("%q: want a clean absolute path such as /check", fa.Path), "forward_auth", "path")
	}
	if fa.RefusalStatus == 0 {
		fa.RefusalStatus = http.StatusTooManyRequests
	}
	switch fa.RefusalStatus {
	case http.StatusTooManyRequests, http.StatusForbidden, http.StatusUnauthorized:
	default:
		return c.errAt(fmt.Sprintf("%d: want 429, or 403 (or 401) for nginx's auth_request", fa.RefusalStatus), "forward_auth", "refusal_status")
	}
	if len(c.ClientIP.trusted) == 0 {
		return c.errAt("no client_ip.trusted_proxies: list the gateway's address, the only caller the endpoint answers", "forward_auth")
	}
	return nil
}

// The headers a gateway describes the original request with: Caddy and
// Traefik send the X-Forwarded- set; nginx sends what its auth location
// sets, conventionally X-Original-URI and X-Original-Method.
var originalHeaders = [3][2]string{
	{"X-Forwarded-Method", "X-Original-Method"},
	{"X-Forwarded-Uri", "X-Original-Uri"},
	{"X-Forwarded-Host", "X-Original-Host"},
}

// ForwardAuth is the decision endpoint (ForwardAuthConfig): it rebuilds the
// original request from the gateway's headers, runs every rule on it as
// ServeHTTP would, counts it, and answers 200 with the RateLimit fields, or
// the refusal. Only a caller in client_ip.trusted_proxies is answered (403
// otherwise): the client address is read from the forwarding header that
// caller sets. Mount it at ForwardAuthConfig.Path.
//
// What only a proxy can do is not done here: a wallet is charged its
// cost and never reconciled (no upstream response passes through), in-flight
// caps count checks in progress, and a drip tarpit refuses at once.
func (m *Middleware) ForwardAuth() http.Handler {
	return http.HandlerFunc(m.forwardAuth)
}

func (m *Middleware) forwardAuth(w http.ResponseWriter, r *http.Request) {
	st := m.state.Load()
	if peer := parseHost(r.RemoteAddr); !peer.IsValid() || !st.cfg.ClientIP.isTrusted(peer) {
		m.met.badRequests.Add(1)
		writeProblem(w, http.StatusForbidden, fmt.Sprintf("forward_auth: the caller %s is not in client_ip.trusted_proxies: only the gateway may ask", peer))
		return
	}
	orig, why := originalRequest(r)
	if why != "" {
		m.badRequest(w, r, why)
		return
	}
	m.serve(w, orig, allowed, true)
}

// allowed answers an admitted check: the rate-limit fields are set already.
var allowed = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
})

// originalRequest rebuilds the request a gateway asks about, or says what
// is wrong with its headers.
func originalRequest(r *http.Request) (*http.Request, string) {
	var v [3]string
	for i, names := range originalHeaders {
		for _, name := range names {
			vals := r.Header.Values(name)
			if len(vals) > 1 {
				return nil, "forward_auth: " + name + " sent more than once"
			}
			if len(vals) == 1 {
				if v[i] != "" && v[i] != vals[0] {
					return nil, fmt.Sprintf("forward_auth: %s and %s disagree", names[0], names[1])
				}
				v[i] = vals[0]
			}
		}
	}
	method, uri, host := v[0], v[1], v[2]
	switch {
	case method == "":
		return nil, "forward_auth: no X-Forwarded-Method or X-Original-Method: the gateway must send the original method"
	case !validMethod(method):
		return nil, fmt.Sprintf("forward_auth: %.64q is not a method", method)
	case uri == "":
		return nil, "forward_auth: no X-Forwarded-Uri or X-Original-URI: the gateway must send the original request URI"
	case uri[0] != '/':
		return nil, fmt.Sprintf("forward_auth: the original URI %.64q must start with /", uri)
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, fmt.Sprintf("forward_auth: the original URI %.64q: %v", uri, err)
	}
	if host == "" {
		host = r.Host
	}
	o := r.Clone(r.Context())
	o.Method, o.URL, o.RequestURI, o.Host = method, u, uri, host
	o.Body, o.ContentLength, o.TransferEncoding = http.NoBody, 0, nil
	o.Header.Del("Content-Length")
	return o, ""
}

// validMethod reports whether m is an HTTP token (RFC 9110, 5.6.2).
func validMethod(m string) bool {
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
