package sketchproxy

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// isCheck reports whether a request path is fa's check's, in any spelling an
// upstream might serve it under: cleaned, in any case, with or without a
// trailing slash, segment parameters or trailing dots.
func isCheck(fa *ForwardAuthConfig, p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := httpnorm.CleanPath(p)
	for _, q := range [2]string{c, httpnorm.LoosePath(c)} {
		if len(q) > 1 {
			q = strings.TrimSuffix(q, "/")
		}
		if strings.EqualFold(q, fa.Path) {
			return true
		}
	}
	return false
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
// caller sets. It answers at ForwardAuthConfig.Path, whatever query the
// gateway adds (Caddy sends the original one), and 404 at any other path.
//
// What only a proxy can do is not done here: a wallet is charged its
// cost and never reconciled (no upstream response passes through), in-flight
// caps count checks in progress, and a drip tarpit refuses at once.
func (m *Middleware) ForwardAuth() http.Handler {
	return http.HandlerFunc(m.forwardAuth)
}

func (m *Middleware) forwardAuth(w http.ResponseWriter, r *http.Request) {
	st := m.state.Load()
	fa := st.cfg.ForwardAuth
	if fa == nil || !isCheck(fa, r.URL.Path) {
		m.refuse(w, r, st, nil, refusal{code: http.StatusNotFound, why: "no upstream here: this address answers only the forward_auth check"})
		return
	}
	if peer := clientip.ParseAddr(r.RemoteAddr); !peer.IsValid() || !st.ci.trusted.Contains(peer) {
		m.refuse(w, r, st, nil, refusal{code: http.StatusForbidden, why: fmt.Sprintf("forward_auth: the caller %s is not in client_ip.trusted_proxies: only the gateway may ask", peer)})
		return
	}
	if fa.RefusalStatus != http.StatusTooManyRequests {
		w = &passableWriter{ResponseWriter: w, refusal: fa.RefusalStatus}
	}
	orig, chk, why := originalRequest(r, fa.Gateway)
	if why != "" {
		m.refuse(w, r, st, nil, refusal{code: http.StatusBadRequest, why: why})
		return
	}
	m.serve(w, orig, allowed, chk)
}

// passableWriter sends every answer that is neither 2xx nor one the
// gateway passes on (nginx: 401 and 403) with the refusal status, and its
// own status in SketchProxy-Status, so that nginx can tell its client a
// bad request from a refusal instead of answering 500.
type passableWriter struct {
	http.ResponseWriter
	refusal int
}

func (w *passableWriter) WriteHeader(code int) {
	if code >= 300 && code != http.StatusUnauthorized && code != http.StatusForbidden {
		w.Header().Set("SketchProxy-Status", strconv.Itoa(code))
		code = w.refusal
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *passableWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// allowed answers an admitted check: the rate-limit fields are set already.
var allowed = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
})

// originalRequest rebuilds the request a gateway asks about, with the
// hosts a gateway not named may route on besides its Host, or says what is
// wrong with its headers.
func originalRequest(r *http.Request, gateway string) (*http.Request, *check, string) {
	var v [3]string
	var alt []string
	for i, names := range originalHeaders {
		for j, name := range names {
			switch {
			case gateway == gatewayNginx && j == 0,
				gateway == gatewayCaddy && (j == 1 || i == 2),
				gateway == gatewayTraefik && j == 1:
				continue // a header this gateway does not set: the client's
			}
			vals := r.Header.Values(name)
			if len(vals) > 1 {
				return nil, nil, "forward_auth: " + name + " sent more than once"
			}
			if len(vals) == 0 {
				continue
			}
			if i == 2 && gateway == "" {
				alt = append(alt, vals[0]) // either may be what the gateway routes on
				continue
			}
			if v[i] != "" && v[i] != vals[0] {
				return nil, nil, fmt.Sprintf("forward_auth: %s and %s disagree", names[0], names[1])
			}
			v[i] = vals[0]
		}
	}
	method, uri, host := v[0], v[1], v[2]
	want := "X-Forwarded-Method or X-Original-Method"
	switch gateway {
	case gatewayNginx:
		want = "X-Original-Method (proxy_set_header X-Original-Method $request_method)"
	case gatewayCaddy, gatewayTraefik:
		want = "X-Forwarded-Method"
	}
	switch {
	case method == "":
		return nil, nil, "forward_auth: no " + want + ": the gateway must send the original method"
	case !httpnorm.ValidMethod(method):
		return nil, nil, fmt.Sprintf("forward_auth: %.64q is not a method", method)
	case uri == "":
		return nil, nil, "forward_auth: no " + strings.ReplaceAll(want, "Method", "Uri") + ": the gateway must send the original request URI"
	case uri[0] != '/':
		return nil, nil, fmt.Sprintf("forward_auth: the original URI %.64q must start with /", uri)
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, nil, fmt.Sprintf("forward_auth: the original URI %.64q: %v", uri, err)
	}
	if host == "" && (gateway == gatewayCaddy || gateway == "") {
		host = r.Host // Caddy passes the Host it routes on
	}
	// Else no host: nginx sends no X-Original-Host for a request without
	// Host (HTTP/1.0), and every host rule judges such a request.
	o := r.Clone(r.Context())
	o.Method, o.URL, o.RequestURI, o.Host = method, u, uri, host
	o.Body, o.ContentLength, o.TransferEncoding = http.NoBody, 0, nil
	o.Header.Del("Content-Length")
	var chk check
	for _, a := range alt {
		if _, name, ok := httpnorm.CanonicalHost(a); !ok {
			return nil, nil, fmt.Sprintf("forward_auth: the forwarded host %.64q is not a host name or address with at most one port", a)
		} else if name != "" {
			chk.alt = append(chk.alt, name)
		}
	}
	return o, &chk, ""
}
