package caddyepochsketch

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/keysrc"
)

// Keys: a zone's key is a template of placeholders, resolved per request.
//
// Caddy's own placeholders for a request field a client may send more than
// once join the values with commas: {http.request.header.X-API-Key} reads
// "alice,junk1" for a request with the header twice, a new key for each
// junk value, while the application behind Caddy reads alice. So the
// handler resolves these placeholders itself:
//
//   - A header sent more than once counts under its first value. Where an
//     application reads one value, it reads the first (Go's Header.Get,
//     Java's getHeader, Starlette); others see the values joined ("alice,
//     junk1", which is no key of theirs). Caddy drops a header spelled with
//     '_' or '.' before any handler runs, so X_API_Key never stands in for
//     X-API-Key (CGI and PHP read them as one).
//   - A query parameter or cookie given more than once is refused with
//     400: applications disagree on which one they read (Go and Flask the
//     first, PHP and Django the last), so no value is safe to count.
//
// Every other placeholder is Caddy's. A key that resolves to nothing is
// "-", one count for all such requests.

// keyTemplate is a zone's key, parsed.
type keyTemplate []keyPart

// keyPart is a piece of a key: text for Caddy's replacer (literal text and
// any placeholders but the three below), or a header, query parameter or
// cookie read here.
type keyPart struct {
	kind byte // 0: text for the replacer; 'h' header, 'q' query, 'c' cookie
	text string
}

// The placeholders the handler reads itself (the Caddyfile's {header.*},
// {query.*} and {cookie.*} are these).
const (
	headerPrefix = "http.request.header."
	queryPrefix  = "http.request.uri.query."
	cookiePrefix = "http.request.cookie."
)

// parseKey splits a key into its parts.
func parseKey(s string) (keyTemplate, error) {
	var kt keyTemplate
	text := func(t string) {
		if t == "" {
			return
		}
		if n := len(kt); n > 0 && kt[n-1].kind == 0 {
			kt[n-1].text += t
			return
		}
		kt = append(kt, keyPart{text: t})
	}
	for s != "" {
		i := strings.IndexByte(s, '{')
		if i < 0 || i > 0 && s[i-1] == '\\' {
			if i < 0 {
				text(s)
				break
			}
			text(s[:i+1]) // an escaped brace: the replacer's
			s = s[i+1:]
			continue
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("a { without its }: write placeholders whole, e.g. {http.request.header.X-API-Key}")
		}
		text(s[:i])
		name := s[i+1 : i+j]
		switch {
		case strings.HasPrefix(name, headerPrefix) && len(name) > len(headerPrefix):
			kt = append(kt, keyPart{'h', textproto.CanonicalMIMEHeaderKey(name[len(headerPrefix):])})
		case strings.HasPrefix(name, queryPrefix) && len(name) > len(queryPrefix):
			kt = append(kt, keyPart{'q', name[len(queryPrefix):]})
		case strings.HasPrefix(name, cookiePrefix) && len(name) > len(cookiePrefix):
			kt = append(kt, keyPart{'c', name[len(cookiePrefix):]})
		default:
			text(s[i : i+j+1])
		}
		s = s[i+j+1:]
	}
	return kt, nil
}

// resolve returns the request's key, or why no key can be read safely.
func (kt keyTemplate) resolve(r *http.Request, repl *caddy.Replacer) (key, why string) {
	if len(kt) == 1 && kt[0].kind == 'h' { // the usual key: no builder
		if vs := r.Header[kt[0].text]; len(vs) > 0 && vs[0] != "" {
			return header(kt[0].text, vs[0]), ""
		}
		return "-", ""
	}
	var b strings.Builder
	for _, p := range kt {
		switch p.kind {
		case 0:
			b.WriteString(repl.ReplaceAll(p.text, ""))
		case 'h':
			if vs := r.Header[p.text]; len(vs) > 0 {
				b.WriteString(header(p.text, vs[0]))
			}
		case 'q':
			vs := keysrc.Query(r.URL.RawQuery, p.text)
			if len(vs) > 1 {
				return "", fmt.Sprintf("the key parameter %.64q is given %d times", p.text, len(vs))
			}
			if len(vs) == 1 {
				b.WriteString(vs[0])
			}
		case 'c':
			var val string
			n := 0
			for _, c := range r.Cookies() { // in any case, as Caddy's placeholder reads it
				if strings.EqualFold(c.Name, p.text) {
					val, n = c.Value, n+1
				}
			}
			if n > 1 {
				return "", fmt.Sprintf("the key cookie %.64q is sent %d times", p.text, n)
			}
			b.WriteString(val)
		}
	}
	if b.Len() == 0 {
		return "-", ""
	}
	return b.String(), ""
}

// header is the value v of the header name as a key: credentials with
// their scheme in one spelling ("bearer abc" for "BEARER  abc").
func header(name, v string) string {
	if keysrc.IsCredentials(name) {
		return keysrc.Credentials(v)
	}
	return v
}

// clientPrefix is {http.epochsketch.client_prefix} for r: the client's
// address as SketchProxy's ip key groups it, an IPv6 address cut to its
// /64 (the one subscriber's whole network, so that rotating through it
// gains no requests), or "-" if there is none.
//
// The address is the right-most one in the server's client IP headers
// (X-Forwarded-For by default) that is not a trusted proxy, when the
// connection comes from a trusted proxy; else the connection's. Caddy's
// {client_ip} is that with trusted_proxies_strict; without it Caddy takes
// the left-most address, which any client writes itself
// ("X-Forwarded-For: 10.0.0.7, ..." is appended to, not replaced, by the
// proxies in front).
func clientPrefix(r *http.Request) string {
	ip, _ := caddyhttp.GetVar(r.Context(), caddyhttp.ClientIPVarKey).(string)
	trusted, _ := caddyhttp.GetVar(r.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	if srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && trusted && srv.TrustedProxiesStrict == 0 {
		ip = rightmostUntrusted(r, srv)
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return "-"
	}
	return clientip.Key(a.Unmap(), 32, 64)
}

// maxHops bounds the trusted addresses read right to left: a chain of
// proxies longer than that is not a deployment, and each look costs a
// probe.
const maxHops = 16

// rightmostUntrusted reads srv's client IP headers right to left and
// returns the first address that srv does not trust; the connection's
// address if there is none (every hop trusted) or past maxHops.
func rightmostUntrusted(r *http.Request, srv *caddyhttp.Server) string {
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = r.RemoteAddr
	}
	hops := 0
	for _, name := range srv.ClientIPHeaders {
		vals := r.Header.Values(name)
		for i := len(vals) - 1; i >= 0; i-- {
			parts := strings.Split(vals[i], ",")
			for j := len(parts) - 1; j >= 0; j-- {
				host := strings.TrimSpace(parts[j])
				if h, _, err := net.SplitHostPort(host); err == nil {
					host = h
				}
				host, _, _ = strings.Cut(host, "%")
				a, err := netip.ParseAddr(host)
				if err != nil {
					continue
				}
				if hops++; hops > maxHops {
					return peer
				}
				if !trusts(srv, a) {
					return a.String()
				}
			}
		}
	}
	return peer
}

// trusts reports whether srv's trusted_proxies include a: Caddy decides,
// by preparing a bare request from a as its server does each request
// (the trusted ranges are the server's own, static or fetched).
func trusts(srv *caddyhttp.Server, a netip.Addr) bool {
	pr := &http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/"}, Header: http.Header{},
		RemoteAddr: netip.AddrPortFrom(a, 1).String()}
	pr = caddyhttp.PrepareRequest(pr.WithContext(context.Background()), caddy.NewEmptyReplacer(), nil, srv)
	t, _ := caddyhttp.GetVar(pr.Context(), caddyhttp.TrustedProxyVarKey).(bool)
	return t
}
