package config

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/httpnorm"
)

// ForwardAuthConfig is the decision endpoint a gateway asks before it
// forwards a request (nginx auth_request, Caddy forward_auth, Traefik
// forwardAuth). It proxies nothing: it answers 200 to allow, or refuses
// with RefusalStatus, Retry-After and the RateLimit fields, which the gateway
// passes to its client.
type ForwardAuthConfig struct {
	// Listen, if set, serves the endpoint on its own address; empty serves
	// it on the main listener, where Path is then never proxied.
	Listen string `yaml:"listen" reload:"restart" example:"\"127.0.0.1:8082\""`
	// Path is the endpoint's path: a clean absolute path. On the main
	// listener the path it started with stays the check's until a restart,
	// never proxied.
	Path string `yaml:"path" reload:"restart-on-listen; the old path stays the check's on listen" example:"/check"`
	// RefusalStatus is the status of every refusal: 429, 403 or 401.
	// nginx's auth_request accepts only 2xx, 401 and 403 from the check and turns
	// anything else into 500: give 403 there and map it back to 429 with
	// error_page (docs/nginx.md). With 401 or 403, every
	// other answer that is not 2xx (400 for a bad path, say) is sent with
	// this status too, and its own status in the SketchProxy-Status header.
	RefusalStatus int `yaml:"refusal_status" example:"403"`
	// Gateway names the gateway that asks: "nginx", "caddy" or "traefik".
	// The check then reads only the headers that gateway sets itself, and
	// judges the host it routes on: nginx's X-Original-Method, -URI and
	// -Host; Caddy's X-Forwarded-Method and -Uri, and the Host it passes
	// on; Traefik's X-Forwarded-Method, -Uri and -Host. A client's own
	// copies of the other headers, which the gateway passes through, are
	// ignored. Unset, the check reads both sets (which must agree) and a
	// host rule applies if any of Host, X-Forwarded-Host and
	// X-Original-Host names its host: no spelling escapes a rule, but a
	// client can make more rules apply to itself.
	Gateway string `yaml:"gateway" example:"nginx"`
}

// The gateways the check knows the headers of.
const (
	GatewayNginx   = "nginx"
	GatewayCaddy   = "caddy"
	GatewayTraefik = "traefik"
)

func (c *Config) validateForwardAuth() error {
	fa := c.ForwardAuth
	if fa == nil {
		return nil
	}
	if fa.Path == "" {
		fa.Path = "/check"
	}
	if fa.Listen != "" {
		if err := checkAddr(fa.Listen); err != nil {
			return c.errAt(err.Error(), "forward_auth", "listen")
		}
	}
	if fa.Path[0] != '/' || httpnorm.CleanPath(fa.Path) != fa.Path || strings.ContainsAny(fa.Path, "?#%") {
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
	switch fa.Gateway = strings.ToLower(fa.Gateway); fa.Gateway {
	case "", GatewayNginx, GatewayCaddy, GatewayTraefik:
	default:
		return c.errAt(fmt.Sprintf("%q: want nginx, caddy or traefik (or leave it out)", fa.Gateway), "forward_auth", "gateway")
	}
	if len(c.ClientIP.TrustedProxies) == 0 {
		return c.errAt("no client_ip.trusted_proxies: list the gateway's address, the only caller the endpoint answers", "forward_auth")
	}
	return nil
}
