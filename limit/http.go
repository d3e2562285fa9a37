package limit

import (
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/epochsketch/epochsketch/rate"
)

// Middleware limits each key to l's rate: key(r) names the client of
// request r (RemoteIP is the connection's address), and a refused request
// gets 429 Too Many Requests with Retry-After, without reaching next.
//
// Every answer carries the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-10, as SketchProxy writes them:
//
//	RateLimit-Policy: "default";q=10;w=1
//	RateLimit: "default";r=7;t=1
//
// q requests per w seconds is the limit in whole numbers (2.5 per minute
// is q=5;w=120), r the requests the key may still send (at most q), and t
// the seconds until more quota: the next tick when admitted; the same wait
// as Retry-After, with r=0, when refused. Config.Name names the policy.
//
// For a service behind a proxy or load balancer, RemoteIP is the proxy's
// address: take the client's from the header your proxy sets, trusting it
// only from your proxies. SketchProxy's client_ip settings do exactly
// that (sketchproxy/README.md); or put SketchProxy in front.
func Middleware(l *Limiter, key func(*http.Request) string) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d := l.Decide(time.Time{}, key(r), 1)
			h := w.Header()
			h[hdrPolicy] = []string{l.policy}
			h[hdrRateLimit] = []string{l.item(d)}
			if !d.Allowed {
				wait := strconv.FormatInt(rate.Seconds(d.RetryAfter), 10)
				h.Set("Retry-After", wait)
				http.Error(w, "too many requests: retry after "+wait+" s", http.StatusTooManyRequests)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

// RemoteIP is the client address of r's connection, r.RemoteAddr without
// its port ("192.0.2.1", "2001:db8::1"): a key for Middleware where
// clients connect directly. Behind a proxy it is the proxy's address (see
// Middleware). Each IPv6 address is its own key; a client that rotates
// through its /64 needs a key function that masks the address.
func RemoteIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr // no port: an address as it is
	}
	return host
}

// The fields' canonical keys (http.CanonicalHeaderKey), set directly.
const (
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
)

// setPolicy builds the RateLimit-Policy field: the quoted name, q and w.
func (l *Limiter) setPolicy(name string) {
	if name == "" {
		name = "default"
	}
	l.quoted = strconv.Quote(name)
	l.policy = l.lim.PolicyItem(l.quoted)
}

// item is the RateLimit field for decision d: r is the requests left (at
// most q), t the seconds until more quota, or until the refused request
// fits.
func (l *Limiter) item(d Decision) string {
	r, t := min(int64(d.Remaining), l.lim.Q), rate.Seconds(d.Reset)
	if !d.Allowed {
		r, t = 0, rate.Seconds(d.RetryAfter)
	}
	return string(rate.AppendItem(make([]byte, 0, len(l.quoted)+24), l.quoted, r, t))
}
