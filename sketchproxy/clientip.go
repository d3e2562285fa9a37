package sketchproxy

import (
	"net/http"
	"net/http/httputil"
	"strings"

	"github.com/epochsketch/epochsketch/limit/clientip"
	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// clientIP is client_ip as the doors read it, compiled at install: its
// trusted proxies parsed, and the header its source names.
type clientIP struct {
	*ClientIPConfig
	trusted clientip.Trusted
	header  string // the source's header, canonical
}

// clientIPOf is b's client_ip as the doors read it.
func clientIPOf(b *config.Built) clientIP {
	cc := &b.Config().ClientIP
	return clientIP{ClientIPConfig: cc, trusted: b.TrustedProxies(), header: sourceHeader(cc.Source)}
}

// sourceHeader is the request header a client_ip source reads.
func sourceHeader(source string) string {
	switch source {
	case sourceForwarded:
		return "Forwarded"
	case sourceRealIP:
		return "X-Real-Ip"
	case sourceXFF:
		return "X-Forwarded-For"
	}
	return http.CanonicalHeaderKey(strings.TrimPrefix(source, "header:"))
}

// SetForwarded sets the forwarding headers of a request a reverse proxy
// sends upstream, as a standard reverse proxy does. Call it from
// httputil.ReverseProxy's Rewrite after SetURL (which has removed the
// incoming forwarding headers):
//
//   - X-Forwarded-For: the incoming chain with the peer appended when the
//     peer is a trusted proxy; the peer alone when it is not, so a client's
//     own X-Forwarded-For never reaches the upstream.
//   - X-Forwarded-Host and X-Forwarded-Proto: a trusted proxy's values when
//     it sent them, else this request's host and scheme.
//   - Forwarded, when client_ip.source is "forwarded": the same chain, in
//     RFC 7239 form.
//   - client_ip.set_header (e.g. X-Real-IP): the address SketchProxy
//     identified as the client, overwriting what the client sent. The
//     source header of a single-address source (x-real-ip, header:NAME) is
//     removed when the peer is not trusted.
func (m *Middleware) SetForwarded(pr *httputil.ProxyRequest) {
	ci := &m.state.Load().ci
	in, out := pr.In, pr.Out
	peer := clientip.ParseAddr(in.RemoteAddr)
	trusted := peer.IsValid() && ci.trusted.Contains(peer)
	peerStr := peer.String()
	if !peer.IsValid() {
		peerStr = "unknown"
	}
	chain := func(name, hop string) {
		prior := in.Header.Values(name)
		if trusted && len(prior) > 0 {
			out.Header.Set(name, strings.Join(prior, ", ")+", "+hop)
		} else {
			out.Header.Set(name, hop)
		}
	}
	chain("X-Forwarded-For", peerStr)
	keep := func(name, own string) {
		if v := in.Header.Get(name); trusted && v != "" {
			out.Header.Set(name, v)
		} else {
			out.Header.Set(name, own)
		}
	}
	proto := "http"
	if in.TLS != nil {
		proto = "https"
	}
	keep("X-Forwarded-Host", in.Host)
	keep("X-Forwarded-Proto", proto)
	if ci.Source == sourceForwarded {
		node := peerStr
		if peer.Is6() {
			node = `"[` + peerStr + `]"`
		}
		chain("Forwarded", "for="+node+";proto="+proto)
	}
	if ci.Source == sourceRealIP || strings.HasPrefix(ci.Source, "header:") {
		if h := ci.header; !trusted {
			out.Header.Del(h)
		}
	}
	if ci.SetHeader != "" {
		if a := ci.clientAddr(in); a.IsValid() {
			out.Header.Set(ci.SetHeader, a.String())
		} else {
			out.Header.Del(ci.SetHeader)
		}
	}
}
