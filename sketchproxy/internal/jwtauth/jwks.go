package jwtauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
)

// jwksSource keeps the key set of a JWKS URL: fetched in the background
// at once, then every refresh, and soon after a token names a key it lacks.
// A fetch that fails, or brings an empty or broken set, keeps the keys
// fetched last; nothing ever waits for a fetch, so a slow or hanging JWKS
// endpoint delays no start, reload or request.
type jwksSource struct {
	url     string
	refresh atomic.Int64 // a time.Duration: a reload may change it
	log     *slog.Logger
	client  *http.Client
	keys    atomic.Pointer[jwksKeys]
	kick    chan struct{} // a token named an unknown key
	spacing atomic.Int64  // a time.Duration: the least time between fetches kicked
	ready   chan struct{} // closed at the first good fetch
	done    chan struct{}
	once    sync.Once
}

// jwksKeys is one fetched key set.
type jwksKeys struct {
	kf keyfunc.Keyfunc
	n  int
	at time.Time
}

// jwksRetry is the first wait after a failed fetch; it doubles up to the
// refresh interval. jwksKickEvery spaces fetches asked for by unknown keys.
const (
	jwksRetry     = 5 * time.Second
	jwksKickEvery = 30 * time.Second
	jwksMaxBytes  = 1 << 20
)

// newJWKSSource starts fetching u; until a fetch succeeds, tokens are
// checked against seed (the keys of the URL a reload replaced), if any.
func newJWKSSource(u string, refresh time.Duration, log *slog.Logger, seed *jwksKeys) *jwksSource {
	s := &jwksSource{url: u, log: log, client: &http.Client{Timeout: 10 * time.Second},
		kick: make(chan struct{}, 1), ready: make(chan struct{}), done: make(chan struct{})}
	s.refresh.Store(int64(refresh))
	s.spacing.Store(int64(jwksKickEvery))
	s.keys.Store(seed)
	go s.run()
	return s
}

func (s *jwksSource) stop() { s.once.Do(func() { close(s.done) }) }

// run fetches until stop.
func (s *jwksSource) run() {
	retry := jwksRetry
	var lastKick time.Time
	first := true
	for {
		refresh := time.Duration(s.refresh.Load())
		wait := refresh
		if err := s.fetch(first); err != nil {
			select {
			case <-s.done:
				return // stopped during the fetch: nothing to report
			default:
			}
			if k := s.keys.Load(); k != nil {
				s.log.Warn("jwks refresh failed: keeping the keys fetched before", "err", err.Error(), "url", s.url,
					"keys", k.n, "fetched_at", k.at.UTC().Format(time.RFC3339), "retry_in", retry.String())
			} else {
				s.log.Warn("jwks fetch failed: tokens are refused until a fetch succeeds", "err", err.Error(), "url", s.url, "retry_in", retry.String())
			}
			wait, retry = retry, min(2*retry, refresh)
		} else {
			retry, first = jwksRetry, false
		}
		t := time.NewTimer(wait)
		select {
		case <-s.done:
			t.Stop()
			return
		case <-t.C:
		case <-s.kick:
			t.Stop()
			if d := time.Duration(s.spacing.Load()) - time.Since(lastKick); d > 0 {
				select { // at most one fetch per jwksKickEvery for unknown keys
				case <-s.done:
					return
				case <-time.After(d):
				}
			}
			lastKick = time.Now()
		}
	}
}

// fetch gets the key set once; only a valid one with a usable key replaces
// the keys held. The first good fetch closes ready.
func (s *jwksSource) fetch(first bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url, nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, jwksMaxBytes+1))
	if err != nil {
		return err
	}
	if len(b) > jwksMaxBytes {
		return fmt.Errorf("the key set is over %d bytes", jwksMaxBytes)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return fmt.Errorf("not a JSON Web Key Set: %v", err)
	}
	if len(set.Keys) == 0 {
		return errors.New("the key set has no keys")
	}
	kf, err := keyfunc.NewJWKSetJSON(b)
	if err != nil {
		return fmt.Errorf("not a JSON Web Key Set: %v", err)
	}
	usable, err := usableKeys(ctx, kf)
	if err != nil {
		return err
	}
	s.keys.Store(&jwksKeys{kf: kf, n: usable, at: time.Now()})
	if first {
		close(s.ready)
		s.log.Info("jwks fetched", "url", s.url, "keys", usable)
	}
	return nil
}

// usableKeys counts the keys of a set that can verify a signature: an RSA
// key of 1024 bits or more (Go refuses smaller ones), an ECDSA or Ed25519
// key. A set without one (a broken or truncated set that parses) is an
// error: it must not replace working keys.
func usableKeys(ctx context.Context, kf keyfunc.Keyfunc) (int, error) {
	all, err := kf.Storage().KeyReadAll(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range all {
		switch key := k.Key().(type) {
		case *rsa.PublicKey:
			if key.N.BitLen() >= 1024 {
				n++
			}
		case *rsa.PrivateKey:
			if key.N.BitLen() >= 1024 {
				n++
			}
		case *ecdsa.PublicKey, *ecdsa.PrivateKey, ed25519.PublicKey, ed25519.PrivateKey:
			n++
		}
	}
	if n == 0 {
		return 0, fmt.Errorf("none of the set's %d keys can verify a signature", len(all))
	}
	return n, nil
}

// keyfunc finds a token's key in the set held; a key it lacks asks for a
// fetch, without waiting for it.
func (s *jwksSource) keyfunc(t *jwt.Token) (any, error) {
	k := s.keys.Load()
	if k == nil {
		s.askFetch()
		return nil, errors.New("the key set has not been fetched yet")
	}
	key, err := k.kf.Keyfunc(t)
	if err != nil {
		s.askFetch()
	}
	return key, err
}

func (s *jwksSource) askFetch() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
