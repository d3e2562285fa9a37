package config

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/MicahParks/jwkset"
)

// JWTConfig verifies bearer tokens, so that a rule's key can be a claim of
// a verified token ("jwt:sub", "jwt:org_id" in Rule.Key): an identity a
// client cannot mint, unlike an API key header that any client can vary.
// Exactly one key source is given: HMACSecretFile, PublicKeyFile,
// JWKSFile or JWKSURL.
type JWTConfig struct {
	// Header carries the token: Authorization as "Bearer TOKEN"; any
	// other header holds the bare token.
	Header string `yaml:"header" example:"X-Access-Token"`
	// HMACSecretFile holds a shared secret (HS256, HS384, HS512), at least
	// 32 bytes. The file's trailing newlines (CR and LF) are trimmed: the
	// secret is the rest, every other byte included.
	HMACSecretFile string `yaml:"hmac_secret_file" example:"/etc/sketchproxy/jwt.secret"`
	// PublicKeyFile holds a PEM public key (RSA, ECDSA or Ed25519).
	PublicKeyFile string `yaml:"public_key_file" example:"/etc/sketchproxy/jwt.pub"`
	// JWKSFile holds a JSON Web Key Set.
	JWKSFile string `yaml:"jwks_file" example:"/etc/sketchproxy/jwks.json"`
	// JWKSURL is a JSON Web Key Set fetched at start and every JWKSRefresh,
	// and when a token names an unknown key; start, reload and requests
	// never wait for it.
	JWKSURL string `yaml:"jwks_url" example:"https://id.example.com/.well-known/jwks.json"`
	// JWKSRefresh is how often JWKSURL is fetched again (1m or more).
	JWKSRefresh Duration `yaml:"jwks_refresh" example:"1h"`
	// Issuer, if set, must be the token's iss.
	Issuer string `yaml:"issuer" example:"https://id.example.com/"`
	// Audience, if set, must be among the token's aud.
	Audience string `yaml:"audience" example:"api"`
	// Algorithms are those accepted; by default those of the key: HS* for
	// a secret, RS*/PS*, ES* or EdDSA for a public key, every asymmetric
	// one for a key set. "none" is never accepted.
	Algorithms []string `yaml:"algorithms" example:"[RS256]"`
	// Leeway is the clock skew allowed for exp, nbf and iat, up to 1h (0,
	// or a negative value in code: none).
	Leeway Duration `yaml:"leeway" example:"30s"`
	// RequireExp refuses a token without an exp claim as it refuses an
	// expired one (401): such a token never expires, so one that leaks
	// is a key for good. Set it false to accept such tokens, for an
	// issuer that sets no exp.
	RequireExp *bool `yaml:"require_exp" example:"false"`
}

// JWTKeys are the keys a jwt section's files hold, read when it is
// validated: one of the three, or none for jwks_url (fetched by the
// verifier) and without a jwt section.
type JWTKeys struct {
	secret []byte
	public any
	jwks   json.RawMessage
}

var (
	hmacAlgs = []string{"HS256", "HS384", "HS512"}
	rsaAlgs  = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	ecAlgs   = []string{"ES256", "ES384", "ES512"}
	edAlgs   = []string{"EdDSA"}
)

// validateJWT checks the jwt section and reads its key files, so that
// sketchproxy -check finds a missing or broken key.
func (c *Config) validateJWT(k *JWTKeys) error {
	j := c.JWT
	if j == nil {
		return nil
	}
	at := func(msg string, path ...any) error { return c.errAt(msg, append([]any{"jwt"}, path...)...) }
	if j.Header == "" {
		j.Header = "Authorization"
	}
	if !validHeaderName(j.Header) {
		return at(fmt.Sprintf("%q: not a header name", j.Header), "header")
	}
	if err := orNone(c, &j.Leeway, Duration(30*time.Second), "jwt", "leeway"); err != nil {
		return err
	}
	if j.JWKSRefresh == 0 {
		j.JWKSRefresh = Duration(time.Hour)
	}
	if j.RequireExp == nil {
		j.RequireExp = ptr(true)
	}
	if j.Leeway < 0 || j.Leeway > Duration(time.Hour) {
		return at("want 0 to 1h", "leeway")
	}
	if j.JWKSRefresh < Duration(time.Minute) {
		return at("want 1m or more", "jwks_refresh")
	}
	n := 0
	for _, s := range []string{j.HMACSecretFile, j.PublicKeyFile, j.JWKSFile, j.JWKSURL} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return at("give exactly one of hmac_secret_file, public_key_file, jwks_file and jwks_url")
	}
	algs, err := j.readKey(k, at)
	if err != nil {
		return err
	}
	if len(j.Algorithms) == 0 {
		j.Algorithms = algs
	}
	for i, a := range j.Algorithms {
		ok := false
		for _, b := range algs {
			ok = ok || a == b
		}
		if !ok {
			return at(fmt.Sprintf("%q does not fit the key: want one of %s", a, strings.Join(algs, ", ")), "algorithms", i)
		}
	}
	return nil
}

// readKey reads the one key source j names into k, and returns the
// algorithms its key can verify; at places an error at a jwt field.
func (j *JWTConfig) readKey(k *JWTKeys, at func(msg string, path ...any) error) ([]string, error) {
	switch {
	case j.HMACSecretFile != "":
		b, err := os.ReadFile(j.HMACSecretFile)
		if err != nil {
			return nil, at(err.Error(), "hmac_secret_file")
		}
		k.secret = []byte(strings.TrimRight(string(b), "\r\n"))
		if len(k.secret) < 32 {
			return nil, at(fmt.Sprintf("the secret is %d bytes: use at least 32 random bytes", len(k.secret)), "hmac_secret_file")
		}
		return hmacAlgs, nil
	case j.PublicKeyFile != "":
		b, err := os.ReadFile(j.PublicKeyFile)
		if err != nil {
			return nil, at(err.Error(), "public_key_file")
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil, at("no PEM block: want a PUBLIC KEY in PEM", "public_key_file")
		}
		pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, at("not a public key: "+err.Error(), "public_key_file")
		}
		var algs []string
		switch pub.(type) {
		case *rsa.PublicKey:
			algs = rsaAlgs
		case *ecdsa.PublicKey:
			algs = ecAlgs
		case ed25519.PublicKey:
			algs = edAlgs
		default:
			return nil, at(fmt.Sprintf("a %T key: want RSA, ECDSA or Ed25519", pub), "public_key_file")
		}
		k.public = pub
		return algs, nil
	case j.JWKSFile != "":
		b, err := os.ReadFile(j.JWKSFile)
		if err != nil {
			return nil, at(err.Error(), "jwks_file")
		}
		if err := checkJWKS(b); err != nil {
			return nil, at("not a JSON Web Key Set: "+err.Error(), "jwks_file")
		}
		k.jwks = b
		return anyAlgs(), nil
	default:
		u, err := url.Parse(j.JWKSURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, at(fmt.Sprintf("%q: want an https:// URL", j.JWKSURL), "jwks_url")
		}
		return anyAlgs(), nil
	}
}

// HMACSecret is hmac_secret_file's secret, or nil.
func (k *JWTKeys) HMACSecret() []byte { return k.secret }

// PublicKey is public_key_file's key (an *rsa.PublicKey, an
// *ecdsa.PublicKey or an ed25519.PublicKey), or nil.
func (k *JWTKeys) PublicKey() any { return k.public }

// JWKS is jwks_file's key set, as read, or nil.
func (k *JWTKeys) JWKS() json.RawMessage { return k.jwks }

// checkJWKS checks a JSON Web Key Set as the verifier reads it
// (keyfunc.NewJWKSetJSON, which is jwkset's parsing), with jwkset itself:
// package config needs no JWT library. Its errors read as keyfunc's
// (TestJWKSFileErrorsReadAsKeyfuncs).
func checkJWKS(raw []byte) error {
	var set jwkset.JWKSMarshal
	if err := json.Unmarshal(raw, &set); err != nil {
		return fmt.Errorf("%w: could not unmarshal raw JWK Set JSON", errors.Join(err, errKeyfunc))
	}
	if _, err := set.ToStorage(); err != nil {
		return fmt.Errorf("%w: could not create JWK Set storage", errors.Join(err, errKeyfunc))
	}
	return nil
}

// errKeyfunc is keyfunc.ErrKeyfunc, in its words.
var errKeyfunc = errors.New("failed keyfunc")

// anyAlgs is every algorithm of a key set's keys (RSA, ECDSA, Ed25519).
func anyAlgs() []string {
	return append(append(append([]string{}, rsaAlgs...), ecAlgs...), edAlgs...)
}
