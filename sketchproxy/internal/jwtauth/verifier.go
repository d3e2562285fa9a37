// Package jwtauth verifies the bearer tokens whose claims SketchProxy's
// rules key on (the jwt section: an HMAC secret, a public key, a JWKS file
// or a JWKS URL fetched in the background), with golang-jwt and keyfunc.
// Package config reads the section and its key files; this package holds
// the verifier built from them, so that config, and whatever builds on it
// alone (the Caddy module), links no JWT library. The HTTP doors call
// [Verifier.Check] and answer 401 themselves.
package jwtauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
)

// Verifier checks the tokens of one jwt section. It is safe for concurrent
// use; Stop ends what it runs in the background.
type Verifier struct {
	cfg    *config.JWTConfig
	parser *jwt.Parser
	key    jwt.Keyfunc
	jwks   *jwksSource // the fetched key set, for jwks_url; kept across reloads
}

// New builds the verifier for j, whose key files k holds. A key set fetched from the
// same URL by prev, the running verifier, is kept with its keys: a reload
// never trades working keys for a fetch that may fail.
func New(j *config.JWTConfig, k *config.JWTKeys, prev *Verifier, log *slog.Logger) (*Verifier, error) {
	opts := []jwt.ParserOption{jwt.WithValidMethods(j.Algorithms), jwt.WithLeeway(time.Duration(j.Leeway))}
	if j.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(j.Issuer))
	}
	if j.Audience != "" {
		opts = append(opts, jwt.WithAudience(j.Audience))
	}
	if j.RequireExp == nil || *j.RequireExp {
		opts = append(opts, jwt.WithExpirationRequired())
	}
	v := &Verifier{cfg: j, parser: jwt.NewParser(opts...)}
	switch {
	case k.HMACSecret() != nil:
		secret := k.HMACSecret()
		v.key = func(*jwt.Token) (any, error) { return secret, nil }
	case k.PublicKey() != nil:
		public := k.PublicKey()
		v.key = func(*jwt.Token) (any, error) { return public, nil }
	case k.JWKS() != nil:
		kf, err := keyfunc.NewJWKSetJSON(k.JWKS())
		if err != nil {
			return nil, err
		}
		v.key = kf.Keyfunc
	default:
		switch {
		case prev != nil && prev.jwks != nil && prev.jwks.url == j.JWKSURL:
			v.jwks = prev.jwks // the same keys; a new refresh interval applies from the next wait
			v.jwks.refresh.Store(int64(j.JWKSRefresh))
		case prev != nil && prev.jwks != nil:
			// Another URL: its keys once fetched, and the running ones until then.
			v.jwks = newJWKSSource(j.JWKSURL, time.Duration(j.JWKSRefresh), log, prev.jwks.keys.Load())
		default:
			v.jwks = newJWKSSource(j.JWKSURL, time.Duration(j.JWKSRefresh), log, nil)
		}
		v.key = v.jwks.keyfunc
	}
	return v, nil
}

// Stop ends the key set's refreshes, unless next, the verifier replacing
// this one, keeps them.
func (v *Verifier) Stop(next *Verifier) {
	if v.jwks != nil && (next == nil || next.jwks != v.jwks) {
		v.jwks.stop()
	}
}

// ErrNoToken is a request without a token where a rule's key needs one:
// the door asks for one (RFC 6750, section 3) rather than calling it
// invalid.
var ErrNoToken = errors.New("no bearer token")

// Claims verifies the request's token and returns its claims.
func (v *Verifier) Claims(r *http.Request) (Claims, error) {
	vals := r.Header.Values(v.cfg.Header)
	if len(vals) == 0 {
		return nil, ErrNoToken
	}
	if len(vals) > 1 {
		return nil, fmt.Errorf("%d %s headers", len(vals), v.cfg.Header)
	}
	tok := strings.TrimSpace(vals[0])
	if strings.EqualFold(v.cfg.Header, "Authorization") {
		scheme, rest, ok := strings.Cut(tok, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return nil, ErrNoToken
		}
		tok = strings.TrimSpace(rest)
	}
	var c jwt.MapClaims
	if _, err := v.parser.ParseWithClaims(tok, &c, v.key); err != nil {
		return nil, err
	}
	return Claims(c), nil
}

// Check verifies the request's token, unless c holds its claims already,
// and that it has every claim that key's jwt: parts name; it returns the
// token's claims. A rule keyed on claims is never counted under "-" for a
// claim the token lacks: the door answers 401 with the error.
func (v *Verifier) Check(r *http.Request, c Claims, key []string) (Claims, error) {
	if c == nil {
		var err error
		if c, err = v.Claims(r); err != nil {
			return nil, err
		}
	}
	for _, k := range key {
		if name, ok := strings.CutPrefix(k, "jwt:"); ok {
			if _, err := c.Part(name); err != nil {
				return nil, err
			}
		}
	}
	return c, nil
}

// Claims are a verified token's claims.
type Claims map[string]any

// Part is the claim name as a key part: a string, or a number or boolean
// written out.
func (c Claims) Part(name string) (string, error) {
	switch x := c[name].(type) {
	case string:
		if x == "" {
			return "", fmt.Errorf("the token's %q claim is empty", name)
		}
		return x, nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case json.Number:
		return x.String(), nil
	case bool:
		return strconv.FormatBool(x), nil
	case nil:
		return "", fmt.Errorf("the token has no %q claim", name)
	default:
		return "", fmt.Errorf("the token's %q claim is not a string or a number", name)
	}
}
