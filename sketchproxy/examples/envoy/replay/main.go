// Command replay asks a rate-limit service what Envoy would ask it for a
// request, with Envoy's own configuration and Go client: it reads an Envoy
// bootstrap (envoy.yaml here) into go-control-plane's types, checks it with
// their generated validators, finds the route a request takes, builds the
// descriptors its rate_limits actions make, and calls
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit through
// go-control-plane's client, as Envoy's ratelimit filter does. It then
// prints what Envoy would do: forward the request, answer 429, or, when
// the service cannot be reached, what failure_mode_deny says.
//
// From sketchproxy/, with SketchProxy running on the example's config:
//
//	go run ./cmd/sketchproxy -config examples/envoy/sketchproxy.yaml &
//	go run ./examples/envoy/replay -n 6 -client 203.0.113.1
//	go run ./examples/envoy/replay -n 11 -path /v1/generate -H 'X-API-Key: k1'
//
// Supported: listeners with an http_connection_manager and a static
// route_config; routes matched by prefix, path or safe_regex on the path;
// the filter's domain, or a route's RateLimitPerRoute domain; stage 0; the
// actions source_cluster, destination_cluster, request_headers,
// remote_address, generic_key and header_value_match (string_match, its
// safe_regex a full match as in Envoy, and present_match); the connection
// manager's path_with_escaped_slashes_action REJECT_REQUEST,
// normalize_path (dot segments, unreserved %XX) and merge_slashes, applied
// to :path before routing, in Envoy's order. Anything else is an error
// naming it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"go.yaml.in/yaml/v4"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// headerFlags is -H, repeatable.
type headerFlags []string

func (h *headerFlags) String() string     { return strings.Join(*h, ", ") }
func (h *headerFlags) Set(v string) error { *h = append(*h, v); return nil }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	envoyFile := fs.String("envoy", "examples/envoy/envoy.yaml", "Envoy bootstrap `file` (YAML)")
	rlsAddr := fs.String("rls", "", "the rate-limit service's `host:port` (default: the endpoint of the filter's cluster in the bootstrap)")
	n := fs.Int("n", 1, "how many times to send the request")
	method := fs.String("method", "GET", "the request's method")
	host := fs.String("host", "example.com", "the request's host (:authority)")
	path := fs.String("path", "/", "the request's path, with its query")
	client := fs.String("client", "203.0.113.1", "the client address Envoy sees (remote_address)")
	wait := fs.Duration("timeout", 0, "how long to wait for each answer (default: the filter's timeout, as Envoy waits, 20ms unless set)")
	var headers headerFlags
	fs.Var(&headers, "H", "a request header, `Name: value` (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "replay: %v\n", err)
		return 1
	}
	bs, err := loadBootstrap(*envoyFile)
	if err != nil {
		return fail(err)
	}
	req := request{method: *method, host: *host, path: *path, client: *client, headers: map[string]string{}}
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		if !ok {
			return fail(fmt.Errorf("-H %q: want Name: value", h))
		}
		req.headers[strings.ToLower(strings.TrimSpace(name))] = strings.TrimSpace(value)
	}
	plan, err := planFor(bs, req)
	if err != nil {
		return fail(fmt.Errorf("%s: %v", *envoyFile, err))
	}
	if *rlsAddr == "" {
		if *rlsAddr, err = clusterAddress(bs, plan.cluster); err != nil {
			return fail(fmt.Errorf("%s: %v (or give -rls)", *envoyFile, err))
		}
	}
	fmt.Fprintf(stdout, "%s: route %s, domain %s, %d descriptors, failure_mode_deny %v; asking %s\n",
		*envoyFile, plan.route, plan.domain, len(plan.descriptors), plan.filter.GetFailureModeDeny(), *rlsAddr)
	for _, d := range plan.descriptors {
		fmt.Fprintf(stdout, "  descriptor %s\n", describe(d))
	}
	conn, err := grpc.NewClient(*rlsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	rls := rlsv3.NewRateLimitServiceClient(conn)
	timeout := 20 * time.Millisecond // Envoy's default
	if t := plan.filter.GetTimeout(); t != nil {
		timeout = t.AsDuration()
	}
	if *wait > 0 {
		timeout = *wait
	}
	for i := 1; i <= *n; i++ {
		if plan.rejected != "" {
			fmt.Fprintf(stdout, "request %d: rejected: Envoy answers 400 (%s) and calls no service\n", i, plan.rejected)
			continue
		}
		fmt.Fprintf(stdout, "request %d: %s\n", i, ask(rls, plan, timeout))
	}
	return 0
}

// loadBootstrap reads an Envoy bootstrap in YAML into Envoy's own types
// (unknown fields are errors) and checks it with their validators.
func loadBootstrap(file string) (*bootstrapv3.Bootstrap, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", file, err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := protojson.Unmarshal(js, bs); err != nil {
		return nil, fmt.Errorf("%s: not an Envoy bootstrap: %v", file, err)
	}
	if err := bs.ValidateAll(); err != nil {
		return nil, fmt.Errorf("%s: Envoy's validation: %v", file, err)
	}
	return bs, nil
}

// request is the request replayed.
type request struct {
	method, host, path, client string
	headers                    map[string]string // lower-case names
}

// header is what Envoy's actions read for name: a header, or a pseudo-header.
func (r request) header(name string) (string, bool) {
	switch strings.ToLower(name) {
	case ":path":
		return r.path, true
	case ":method":
		return r.method, true
	case ":authority", "host":
		return r.host, true
	}
	v, ok := r.headers[strings.ToLower(name)]
	return v, ok
}

// plan is what Envoy's ratelimit filter would send for a request.
type plan struct {
	filter      *ratelimitv3.RateLimit
	cluster     string // the rate-limit service's cluster
	route       string // how the route matched, for the reader
	domain      string
	descriptors []*rlv3.RateLimitDescriptor
	// rejected is why the connection manager refuses the request before
	// any filter runs ("": it does not).
	rejected string
}

// planFor finds the first listener's route for r and the descriptors its
// rate limits make.
func planFor(bs *bootstrapv3.Bootstrap, r request) (*plan, error) {
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				return planHCM(hcm, r)
			}
		}
	}
	return nil, errors.New("no listener with an http_connection_manager")
}

func planHCM(hcm *hcmv3.HttpConnectionManager, r request) (*plan, error) {
	p := &plan{}
	for _, hf := range hcm.GetHttpFilters() {
		rl := &ratelimitv3.RateLimit{}
		if hf.GetTypedConfig() != nil && hf.GetTypedConfig().UnmarshalTo(rl) == nil {
			p.filter = rl
			break
		}
	}
	if p.filter == nil {
		return nil, errors.New("no envoy.filters.http.ratelimit filter: Envoy calls no rate-limit service")
	}
	if p.filter.GetStage() != 0 {
		return nil, fmt.Errorf("the ratelimit filter's stage is %d: only stage 0 is replayed", p.filter.GetStage())
	}
	p.domain = p.filter.GetDomain()
	p.cluster = p.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	path, why := normalizePath(hcm, r.path)
	if why != "" {
		p.rejected, p.route = why, "none"
		return p, nil
	}
	r.path = path // routes and actions see the normalized :path, as in Envoy
	rc := hcm.GetRouteConfig()
	if rc == nil {
		return nil, errors.New("no static route_config (RDS is not replayed)")
	}
	vh := virtualHost(rc, r.host)
	if vh == nil {
		return nil, fmt.Errorf("no virtual host for %q", r.host)
	}
	route, how, err := matchRoute(vh, r.path)
	if err != nil || route == nil {
		return nil, fmt.Errorf("no route of %s matches %q: %v", vh.GetName(), r.path, err)
	}
	p.route = how
	if pr, ok := route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"]; ok {
		per := &ratelimitv3.RateLimitPerRoute{}
		if err := pr.UnmarshalTo(per); err != nil {
			return nil, fmt.Errorf("route %s: typed_per_filter_config: %v", how, err)
		}
		if per.GetDomain() != "" {
			p.domain = per.GetDomain()
		}
	}
	limits := route.GetRoute().GetRateLimits()
	if len(limits) == 0 { // the virtual host's, unless the route has its own
		limits = vh.GetRateLimits()
	}
	for i, l := range limits {
		if l.GetStage().GetValue() != 0 {
			continue
		}
		d, err := descriptorFor(l, route, r)
		if err != nil {
			return nil, fmt.Errorf("route %s: rate_limits[%d]: %v", how, i, err)
		}
		if d != nil {
			p.descriptors = append(p.descriptors, d)
		}
	}
	return p, nil
}

// virtualHost is the virtual host Envoy picks for host: an exact domain,
// then a wildcard one.
func virtualHost(rc *routev3.RouteConfiguration, host string) *routev3.VirtualHost {
	var wild *routev3.VirtualHost
	for _, vh := range rc.GetVirtualHosts() {
		for _, d := range vh.GetDomains() {
			switch {
			case strings.EqualFold(d, host):
				return vh
			case d == "*" && wild == nil:
				wild = vh
			case strings.HasPrefix(d, "*") && strings.HasSuffix(strings.ToLower(host), strings.ToLower(d[1:])) && wild == nil:
				wild = vh
			}
		}
	}
	return wild
}

// matchRoute is the first route of vh whose match takes path.
func matchRoute(vh *routev3.VirtualHost, path string) (*routev3.Route, string, error) {
	p, _, _ := strings.Cut(path, "?")
	for _, rt := range vh.GetRoutes() {
		m := rt.GetMatch()
		switch ps := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			if strings.HasPrefix(p, ps.Prefix) {
				return rt, fmt.Sprintf("prefix %q", ps.Prefix), nil
			}
		case *routev3.RouteMatch_Path:
			if p == ps.Path {
				return rt, fmt.Sprintf("path %q", ps.Path), nil
			}
		case *routev3.RouteMatch_SafeRegex:
			re, err := regexp.Compile("^(?:" + ps.SafeRegex.GetRegex() + ")$")
			if err != nil {
				return nil, "", err
			}
			if re.MatchString(p) {
				return rt, fmt.Sprintf("safe_regex %q", ps.SafeRegex.GetRegex()), nil
			}
		default:
			return nil, "", fmt.Errorf("a route matched by %T is not replayed", ps)
		}
	}
	return nil, "", nil
}

// descriptorFor builds the descriptor of one rate limit, as Envoy's
// actions do; nil where an action makes none (Envoy then sends none).
func descriptorFor(l *routev3.RateLimit, route *routev3.Route, r request) (*rlv3.RateLimitDescriptor, error) {
	d := &rlv3.RateLimitDescriptor{}
	add := func(k, v string) { d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: k, Value: v}) }
	for _, a := range l.GetActions() {
		switch s := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_SourceCluster_:
			add("source_cluster", "replay") // Envoy's own --service-cluster
		case *routev3.RateLimit_Action_DestinationCluster_:
			add("destination_cluster", route.GetRoute().GetCluster())
		case *routev3.RateLimit_Action_RemoteAddress_:
			add("remote_address", r.client)
		case *routev3.RateLimit_Action_GenericKey_:
			key := s.GenericKey.GetDescriptorKey()
			if key == "" {
				key = "generic_key"
			}
			add(key, s.GenericKey.GetDescriptorValue())
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := r.header(s.RequestHeaders.GetHeaderName())
			switch {
			case ok:
				add(s.RequestHeaders.GetDescriptorKey(), v)
			case !s.RequestHeaders.GetSkipIfAbsent():
				return nil, nil // the header is missing: no descriptor
			}
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			hv := s.HeaderValueMatch
			matched := true
			for _, hm := range hv.GetHeaders() {
				ok, err := headerMatches(hm, r)
				if err != nil {
					return nil, err
				}
				matched = matched && ok
			}
			if expect := hv.GetExpectMatch(); matched != (expect == nil || expect.GetValue()) {
				return nil, nil
			}
			key := hv.GetDescriptorKey()
			if key == "" {
				key = "header_match"
			}
			add(key, hv.GetDescriptorValue())
		default:
			return nil, fmt.Errorf("the action %T is not replayed", s)
		}
	}
	return d, nil
}

// headerMatches applies one of Envoy's header matchers to r.
func headerMatches(hm *routev3.HeaderMatcher, r request) (bool, error) {
	v, present := r.header(hm.GetName())
	var ok bool
	switch s := hm.GetHeaderMatchSpecifier().(type) {
	case *routev3.HeaderMatcher_PresentMatch:
		ok = present == s.PresentMatch
	case *routev3.HeaderMatcher_StringMatch:
		if !present {
			return hm.GetInvertMatch(), nil
		}
		sm := s.StringMatch
		if sm.GetIgnoreCase() {
			v = strings.ToLower(v)
		}
		norm := func(x string) string {
			if sm.GetIgnoreCase() {
				return strings.ToLower(x)
			}
			return x
		}
		switch m := sm.GetMatchPattern().(type) {
		case *matcherv3.StringMatcher_Exact:
			ok = v == norm(m.Exact)
		case *matcherv3.StringMatcher_Prefix:
			ok = strings.HasPrefix(v, norm(m.Prefix))
		case *matcherv3.StringMatcher_Suffix:
			ok = strings.HasSuffix(v, norm(m.Suffix))
		case *matcherv3.StringMatcher_Contains:
			ok = strings.Contains(v, norm(m.Contains))
		case *matcherv3.StringMatcher_SafeRegex:
			// RE2, matched against the whole value, as Envoy's safe_regex.
			re, err := regexp.Compile("^(?:" + m.SafeRegex.GetRegex() + ")$")
			if err != nil {
				return false, fmt.Errorf("header %s: safe_regex: %v", hm.GetName(), err)
			}
			ok = re.MatchString(v)
		default:
			return false, fmt.Errorf("header %s: a string_match by %T is not replayed", hm.GetName(), m)
		}
	default:
		return false, fmt.Errorf("header %s: a match by %T is not replayed", hm.GetName(), s)
	}
	return ok != hm.GetInvertMatch(), nil
}

// clusterAddress is the first endpoint of the static cluster named name.
func clusterAddress(bs *bootstrapv3.Bootstrap, name string) (string, error) {
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != name {
			continue
		}
		for _, le := range c.GetLoadAssignment().GetEndpoints() {
			for _, ep := range le.GetLbEndpoints() {
				sa := ep.GetEndpoint().GetAddress().GetSocketAddress()
				if sa != nil {
					return net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))), nil
				}
			}
		}
		return "", fmt.Errorf("cluster %s has no static endpoint", name)
	}
	return "", fmt.Errorf("no cluster %q, the ratelimit filter's rate_limit_service", name)
}

// describe writes a descriptor as key=value pairs.
func describe(d *rlv3.RateLimitDescriptor) string {
	var parts []string
	for _, e := range d.GetEntries() {
		parts = append(parts, e.GetKey()+"="+e.GetValue())
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// ask makes one ShouldRateLimit call and says what Envoy would do.
func ask(rls rlsv3.RateLimitServiceClient, p *plan, timeout time.Duration) string {
	if len(p.descriptors) == 0 {
		return "no descriptors: Envoy calls no service and forwards the request"
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: p.domain, Descriptors: p.descriptors})
	if err != nil {
		if p.filter.GetFailureModeDeny() {
			code := 500
			if s := p.filter.GetStatusOnError(); s != nil {
				code = int(s.GetCode())
			}
			return fmt.Sprintf("error (%v): failure_mode_deny, so Envoy answers %d", err, code)
		}
		return fmt.Sprintf("error (%v): failure_mode_deny is off, so Envoy forwards the request", err)
	}
	var hs []string
	for _, h := range resp.GetResponseHeadersToAdd() {
		hs = append(hs, h.GetKey()+": "+h.GetValue())
	}
	var remaining []string
	for _, s := range resp.GetStatuses() {
		if s.GetCurrentLimit() != nil {
			remaining = append(remaining, strconv.Itoa(int(s.GetLimitRemaining())))
		} else {
			remaining = append(remaining, "-")
		}
	}
	what := "OK: Envoy forwards the request"
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		what = "OVER_LIMIT: Envoy answers 429"
	}
	return fmt.Sprintf("%s; remaining %s; headers %s", what, strings.Join(remaining, " "), strings.Join(hs, "; "))
}

// normalizePath is the :path Envoy's connection manager hands to routing
// and filters under hcm's settings, in its order: escaped slashes (%2F,
// %5C) first (REJECT_REQUEST refuses them: why is the reason), then
// normalize_path (RFC 3986: unreserved %XX decoded, other %xx upper-cased,
// dot segments removed), then merge_slashes. The query is left as sent.
func normalizePath(hcm *hcmv3.HttpConnectionManager, full string) (string, string) {
	p, q, hasQ := strings.Cut(full, "?")
	if hcm.GetPathWithEscapedSlashesAction() == hcmv3.HttpConnectionManager_REJECT_REQUEST {
		l := strings.ToLower(p)
		if strings.Contains(l, "%2f") || strings.Contains(l, "%5c") {
			return "", "an escaped slash in the path, path_with_escaped_slashes_action REJECT_REQUEST"
		}
	}
	if hcm.GetNormalizePath().GetValue() {
		p = removeDotSegments(decodeUnreserved(p))
	}
	if hcm.GetMergeSlashes() {
		for strings.Contains(p, "//") {
			p = strings.ReplaceAll(p, "//", "/")
		}
	}
	if hasQ {
		p += "?" + q
	}
	return p, ""
}

// decodeUnreserved decodes the %XX of unreserved characters (RFC 3986
// section 6.2.2.2) and upper-cases the hex digits of the others.
func decodeUnreserved(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] == '%' && i+2 < len(p) {
			if n, err := strconv.ParseUint(p[i+1:i+3], 16, 8); err == nil {
				c := byte(n)
				if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
					b.WriteByte(c)
				} else {
					b.WriteString(strings.ToUpper(p[i : i+3]))
				}
				i += 2
				continue
			}
		}
		b.WriteByte(p[i])
	}
	return b.String()
}

// removeDotSegments is RFC 3986 section 5.2.4 on an absolute path.
func removeDotSegments(p string) string {
	var out []string
	segs := strings.Split(p, "/")[1:]
	for i, s := range segs {
		switch s {
		case ".":
			if i == len(segs)-1 {
				out = append(out, "")
			}
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			if i == len(segs)-1 {
				out = append(out, "")
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}
