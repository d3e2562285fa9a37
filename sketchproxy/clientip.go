package sketchproxy

import (
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
)

// maxHops bounds the walk through a forwarding header: no deployment has
// more proxies than this, and a header of 64 KiB of commas costs nothing.
const maxHops = 64

// sourceHeader is the request header the configured source reads.
func (ci *clientIP) sourceHeader() string {
	switch ci.Source {
	case sourceForwarded:
		return "Forwarded"
	case sourceRealIP:
		return "X-Real-Ip"
	case sourceXFF:
		return "X-Forwarded-For"
	}
	return http.CanonicalHeaderKey(strings.TrimPrefix(ci.Source, "header:"))
}

// clientAddr finds the client's address. The connection's peer is the
// client unless it is a trusted proxy; then the one configured source
// (X-Forwarded-For by default) is read from the right, skipping trusted
// hops, and the first untrusted address is the client: what lies left of it
// was written by the client and is never believed. Every other forwarding
// header is ignored, so a client cannot choose its key by sending one the
// load balancer does not overwrite. A hop that does not parse ("unknown",
// an obfuscated name, garbage) ends the walk at the trusted proxy that
// reported it: headers never fail a request.
func (ci *clientIP) clientAddr(r *http.Request) netip.Addr {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() || !ci.isTrusted(peer) {
		return peer
	}
	values := r.Header.Values(ci.sourceHeader())
	client := peer
	hops := 0
	// Right to left: the last header line first, and in each line the last
	// element first.
	for i := len(values) - 1; i >= 0; i-- {
		v := values[i]
		for v != "" {
			if hops++; hops > maxHops {
				return client
			}
			elem := v
			if j := strings.LastIndexByte(v, ','); j >= 0 {
				elem, v = v[j+1:], v[:j]
			} else {
				v = ""
			}
			if ci.Source == sourceForwarded {
				elem = forwardedFor(elem)
			}
			a := parseHost(elem)
			if !a.IsValid() {
				return client
			}
			client = a
			if !ci.isTrusted(a) {
				return a
			}
		}
	}
	return client
}

// clientIP is a ClientIPConfig with its trusted proxies parsed.
type clientIP struct {
	*ClientIPConfig
	trusted []netip.Prefix
}

func (ci *clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range ci.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseHost reads "1.2.3.4", "1.2.3.4:80", "[::1]:80", "::1", or a
// Forwarded node ("[2001:db8::1]:4711", quoted). IPv4-mapped IPv6 becomes
// IPv4. An invalid Addr means it did not parse.
func parseHost(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap()
	}
	if len(s) >= 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap()
	}
	return netip.Addr{}
}

// forwardedFor is the for= node of one Forwarded element
// (for=192.0.2.60;proto=http;by=203.0.113.43), or "" if it has none, which
// ends the walk.
func forwardedFor(elem string) string {
	for elem != "" {
		pair := elem
		if j := strings.IndexByte(elem, ';'); j >= 0 {
			pair, elem = elem[:j], elem[j+1:]
		} else {
			elem = ""
		}
		k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, "for") {
			return val
		}
	}
	return ""
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
	peer := parseHost(in.RemoteAddr)
	trusted := peer.IsValid() && ci.isTrusted(peer)
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
		if h := ci.sourceHeader(); !trusted {
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
