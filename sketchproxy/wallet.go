package sketchproxy

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// settlement is one admitted request's account with one wallet
// (engine.Wallet): settle charges the usage the upstream reports (once,
// from a header or a trailer); the Decision's Done gives the reservation
// back, unless the transport still drains the response for a trailer,
// which then releases it when the drain ends.
type settlement struct {
	m        *Middleware
	w        *engine.Wallet
	draining atomic.Bool // the transport reads the rest of the response for a trailer
}

type settlements []*settlement

func (ss settlements) settle(h http.Header, trailer bool) {
	for _, s := range ss {
		s.settle(h, trailer)
	}
}

// settle charges the usage h reports in the wallet's reconcile header (with
// trailer, also as an undeclared trailer, http.TrailerPrefix+name). It
// reports whether the settlement is done.
func (s *settlement) settle(h http.Header, trailer bool) bool {
	if s.w.Settled() {
		return true
	}
	b := s.w.Spec()
	name := b.ReconcileHeader
	if name == "" || h == nil {
		return false
	}
	v := h.Get(name)
	if v == "" && trailer {
		v = h.Get(http.TrailerPrefix + name)
	}
	if v == "" {
		return false
	}
	m := s.m
	used, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if errors.Is(err, strconv.ErrRange) {
		used, err = math.MaxUint64, nil // saturate: a huge report is a huge charge, never a free one
	}
	if err != nil {
		if !s.w.MarkSettled() {
			return true
		}
		m.met.reconcileErrors.Add(1)
		if ok, skipped := m.billLogs.Allow(m.now(), logsPerSecond); ok {
			m.log.Warn("sketchproxy reconcile header is not a whole number: only the cost was charged",
				"rule", s.w.Rule().Name, "budget", b.Name, "key", m.display(s.w.Key()), "header", name,
				"value", truncate(v, 64), "log_lines_skipped", skipped)
		}
		return true
	}
	if charged, first := s.w.Settle(used); first {
		m.met.reported.Add(used)
		m.met.reconciled.Add(charged)
	}
	return true
}

type settlementsKey struct{}

// detach prepares a wallet request for the Middleware's Transport: the
// upstream request no longer ends when the client goes away, but
// reconcile_wait later, so that the upstream's report of what the request
// used arrives and is charged. Without the Transport it changes nothing.
// done ends the upstream request once the handler and any drain are over.
func (m *Middleware) detach(r *http.Request, ss settlements) (*http.Request, func()) {
	if !m.transport.Load() {
		return r, func() {}
	}
	wait := time.Duration(0)
	for _, s := range ss {
		wait = max(wait, s.w.Spec().ReconcileWait)
	}
	ctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(r.Context()), settlementsKey{}, ss))
	stop := context.AfterFunc(r.Context(), func() { time.AfterFunc(wait, cancel) })
	return r.WithContext(ctx), func() {
		stop()
		draining := false
		for _, s := range ss {
			draining = draining || s.draining.Load()
		}
		if !draining {
			cancel()
		} else {
			time.AfterFunc(wait, cancel)
		}
	}
}

// Transport wraps the transport a reverse proxy sends upstream requests
// with, so that wallets are charged what the upstream reports however the
// response ends: from its headers as soon as they arrive, from its
// trailers (streaming APIs report usage last) when the body ends, and, if
// the client has gone, by reading the rest of the response for up to
// reconcile_wait. cmd/sketchproxy uses it; a library user whose handler is
// an httputil.ReverseProxy sets its Transport to it.
func (m *Middleware) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	m.transport.Store(true)
	return &walletTransport{base: base}
}

type walletTransport struct{ base http.RoundTripper }

func (t *walletTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ss, _ := req.Context().Value(settlementsKey{}).(settlements)
	resp, err := t.base.RoundTrip(req)
	if err != nil || len(ss) == 0 {
		return resp, err
	}
	var open settlements
	for _, s := range ss {
		if !s.settle(resp.Header, false) {
			open = append(open, s)
		}
	}
	if len(open) > 0 && resp.Body != nil {
		resp.Body = &settleBody{ReadCloser: resp.Body, resp: resp, ss: open}
	}
	return resp, nil
}

// settleBody settles from the response's trailers when the body ends, and
// when it is closed early (the client went away) reads the rest in the
// background, within the request's context, to find them.
type settleBody struct {
	io.ReadCloser
	resp *http.Response
	ss   settlements
	eof  bool
}

func (b *settleBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.eof {
		b.eof = true
		b.ss.settle(b.resp.Trailer, true)
	}
	return n, err
}

func (b *settleBody) Close() error {
	if b.eof {
		return b.ReadCloser.Close()
	}
	var drained settlements
	for _, s := range b.ss {
		if !s.w.Settled() {
			s.w.Keep() // the drain releases it, not the request's Done
			s.draining.Store(true)
			drained = append(drained, s)
		}
	}
	go func() {
		io.Copy(io.Discard, b.ReadCloser) // ends at EOF or when reconcile_wait cancels the request
		b.ReadCloser.Close()
		b.ss.settle(b.resp.Trailer, true)
		for _, s := range drained {
			s.w.Release()
		}
	}()
	return nil
}
