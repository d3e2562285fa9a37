package caddyepochsketch

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// Keys that only exist later.
//
// A key is read where the handler runs. Caddy leaves a placeholder it
// does not know, or one no handler has set yet, empty: every request
// then has the key "-", one count for the whole site, and nothing says
// so. The handler refuses two such keys when it is provisioned:
//
//   - a placeholder Caddy has no value for at all ({remote_ip}, a typo,
//     or a Caddyfile shorthand written in JSON: knownPlaceholder);
//   - a value an authentication handler that runs after this one sets:
//     {http.auth.*} before basic_auth (Caddy's "authentication"
//     handler), or a header that forward_auth copies from its answer
//     (a reverse_proxy's handle_response routes set and delete it) before
//     that forward_auth. The client's own header is read then: each
//     client picks its key. (laterAuth.)
//
// The directive is ordered before basic_auth and forward_auth on purpose
// (caddyfile.go): a limit by address must see unauthenticated floods and
// password guessing. A zone keyed by user goes after authentication in a
// route block, or every epochsketch directive does with "order epochsketch
// after forward_auth" (README.md, Where it runs).

// dynamicPlaceholders are placeholders handlers set while a request runs
// (or that Caddy reads only then): unknown on a blank request, known to
// Caddy.
var dynamicPlaceholders = []string{
	"http.auth.", "http.vars.", "http.reverse_proxy.", "http.error.", "http.regexp.",
	"http.matchers.", "http.response.", "http.intercept.", "http.request.tls.",
	"http.epochsketch.", "http.request.body", "http.shutting_down", "http.time_until_shutdown",
}

// knownPlaceholder says why Caddy has no value for the placeholder name
// ("" if it has one): it resolves name on a blank request, as Caddy's
// handlers would on any request, past the placeholders that handlers
// set. A name in another module's namespace ("geoip2.country") is that
// module's: it is let through.
func knownPlaceholder(name string) string {
	for _, p := range dynamicPlaceholders {
		if strings.HasPrefix(name, p) {
			return ""
		}
	}
	req, _ := http.NewRequest(http.MethodGet, "http://example.com/", http.NoBody)
	req.RemoteAddr = "192.0.2.1:1234"
	if _, ok := caddyhttp.NewTestReplacer(req).Get(name); ok {
		return ""
	}
	if strings.Contains(name, ".") && !strings.HasPrefix(name, "http.") {
		return ""
	}
	why := fmt.Sprintf("Caddy has no placeholder {%s}: it would be empty for every request, one count for all of them", name)
	seg := caddyfile.Segment{{Text: "{" + name + "}"}}
	httpcaddyfile.NewShorthandReplacer().ApplyToSegment(&seg)
	if long := seg[0].Text; long != "{"+name+"}" {
		return why + fmt.Sprintf("; {%s} is the Caddyfile's shorthand: in JSON write %s", name, long)
	}
	if !strings.Contains(name, ".") && !addressLike(name) {
		// A name of its own: a map directive's output ({section}) or a
		// vars handler's, which a blank request cannot show.
		return ""
	}
	// The long forms: {remote_host} and {client_ip} are the Caddyfile's
	// shorthands, which JSON does not have.
	return why + "; for the client's address write {http.request.remote.host} (the connection's), {http.vars.client_ip} (past trusted_proxies) or {http.epochsketch.client_prefix} (IPv6 by /64)"
}

// placeholders returns the names of the placeholders in key.
func placeholders(key string) []string {
	var names []string
	for s := key; ; {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			return names
		}
		if i > 0 && s[i-1] == '\\' {
			s = s[i+1:]
			continue
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return names
		}
		names = append(names, s[i+1:i+j])
		s = s[i+j+1:]
	}
}

// rawHandler is what laterAuth reads of a handler not yet provisioned.
type rawHandler struct {
	Handler        string           `json:"handler"`
	Routes         []rawRoute       `json:"routes"`          // subroute
	HandleResponse []rawRespHandler `json:"handle_response"` // reverse_proxy
	Request        *rawHeaderOps    `json:"request"`         // headers
}

type rawRoute struct {
	Group  string            `json:"group"`
	Handle []json.RawMessage `json:"handle"`
}

type rawRespHandler struct {
	Routes []rawRoute `json:"routes"`
}

type rawHeaderOps struct {
	Set    map[string][]string `json:"set"`
	Delete []string            `json:"delete"`
}

// laterAuth checks that no zone's key is set by an authentication handler
// that runs after this handler (see Keys that only exist later): in the
// rest of the route that holds it, and in the routes after that one, at
// each level of routes up to the server. It knows where it is among the
// route's handlers by its JSON, as Caddy has not stored the route's
// handlers yet; where it cannot tell, it checks nothing.
func (h *Handler) laterAuth(ctx caddy.Context) error {
	var auth bool
	headers := map[string]string{} // canonical header -> zone
	var authZone string
	for _, name := range h.names() {
		z := h.Zones[name]
		for _, p := range placeholders(z.Key) {
			if strings.HasPrefix(p, "http.auth.") && !auth {
				auth, authZone = true, name
			}
			if hd, ok := strings.CutPrefix(p, headerPrefix); ok && hd != "" {
				headers[http.CanonicalHeaderKey(hd)] = name
			}
		}
	}
	if !auth && len(headers) == 0 {
		return nil
	}
	self, err := json.Marshal(h)
	if err != nil {
		return nil
	}
	after, ok := handlersAfter(ctx, self)
	if !ok {
		return nil
	}
	var walk func(raws []json.RawMessage) error
	walk = func(raws []json.RawMessage) error {
		for _, raw := range raws {
			var rh rawHandler
			if json.Unmarshal(raw, &rh) != nil {
				continue
			}
			switch rh.Handler {
			case "authentication":
				if auth {
					return fmt.Errorf("epochsketch: zone %q: its key names {http.auth.*}, which basic_auth (Caddy's authentication handler) sets after this handler runs: every request would be one count, \"-\". "+
						"The directive runs before basic_auth and forward_auth so that limits by address stop floods and password guessing before them; "+
						"to count by user, write the zone after the authentication in a route block (route { basic_auth { ... } epochsketch { zone %s { ... } } ... }), "+
						"or add \"order epochsketch after forward_auth\" to the global options (every epochsketch directive then runs after authentication)", authZone, authZone)
				}
			case "subroute":
				for _, r := range rh.Routes {
					if err := walk(r.Handle); err != nil {
						return err
					}
				}
			case "reverse_proxy":
				for _, hr := range rh.HandleResponse {
					for _, r := range hr.Routes {
						if err := copied(r.Handle, headers); err != nil {
							return err
						}
					}
				}
			}
		}
		return nil
	}
	return walk(after)
}

// handlersAfter returns the handlers that may run after the handler whose
// JSON is self: the rest of its route and the routes after that one, at
// each level of routes up to the server; ok is false where it cannot tell
// where self is.
func handlersAfter(ctx caddy.Context, self []byte) (after []json.RawMessage, ok bool) {
	var levels []caddyhttp.RouteList
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok {
		levels = append(levels, srv.Routes)
	}
	for _, m := range ctx.Modules() {
		if sr, ok := m.(*caddyhttp.Subroute); ok {
			levels = append(levels, sr.Routes)
		}
	}
	for depth := len(levels) - 1; depth >= 0; depth-- {
		rs := levels[depth]
		cur := slices.IndexFunc(rs, func(r caddyhttp.Route) bool { return r.HandlersRaw != nil })
		if cur < 0 {
			return nil, false
		}
		if depth == len(levels)-1 {
			i := slices.IndexFunc(rs[cur].HandlersRaw, func(raw json.RawMessage) bool { return sameHandler(raw, self) })
			if i < 0 {
				return nil, false
			}
			after = append(after, rs[cur].HandlersRaw[i+1:]...)
		}
		if rs[cur].Terminal {
			break
		}
		for _, r := range rs[cur+1:] {
			if r.Group != "" && r.Group == rs[cur].Group {
				continue // one route of a group runs
			}
			after = append(after, r.HandlersRaw...)
		}
	}
	return after, true
}

// copied reports a key header that a forward_auth's handle_response
// routes (raws) set or delete on the request.
func copied(raws []json.RawMessage, headers map[string]string) error {
	for _, raw := range raws {
		var rh rawHandler
		if json.Unmarshal(raw, &rh) != nil || rh.Handler != "headers" || rh.Request == nil {
			continue
		}
		names := slices.Clone(rh.Request.Delete)
		for n := range rh.Request.Set {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			if zone, ok := headers[http.CanonicalHeaderKey(n)]; ok {
				return fmt.Errorf("epochsketch: zone %q: its key names the header %s, which forward_auth copies from its answer after this handler runs: the client's own %s would be read, a key each client picks. "+
					"The directive runs before basic_auth and forward_auth so that limits by address stop floods before them; "+
					"to count by the header forward_auth sets, write the zone after forward_auth in a route block (route { forward_auth ... epochsketch { zone %s { ... } } ... }), "+
					"or add \"order epochsketch after forward_auth\" to the global options (every epochsketch directive then runs after authentication)",
					zone, http.CanonicalHeaderKey(n), http.CanonicalHeaderKey(n), zone)
			}
		}
	}
	return nil
}

// sameHandler reports whether raw is an epochsketch handler whose
// configuration is self (json.Marshal of a Handler).
func sameHandler(raw json.RawMessage, self []byte) bool {
	var probe struct {
		Handler string `json:"handler"`
	}
	if json.Unmarshal(raw, &probe) != nil || probe.Handler != "epochsketch" {
		return false
	}
	var other Handler
	if json.Unmarshal(raw, &other) != nil {
		return false
	}
	b, err := json.Marshal(&other)
	return err == nil && string(b) == string(self)
}

// addressLike reports whether a placeholder name without a dot reads as
// the client's address or identity ({remote_ip}, {client_addr}, {user}):
// names Caddy does not have, which a map or vars handler rarely sets, and
// which made a whole site one count when they were accepted.
func addressLike(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"ip", "addr", "remote", "client", "host", "forwarded", "user", "peer"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}
