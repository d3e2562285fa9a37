package main

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"
)

// errUpstreamTimeout is an upstream silent for server.upstream_timeout.
var errUpstreamTimeout = errors.New("the upstream sent nothing for server.upstream_timeout")

// silenceTransport bounds how long an upstream may stay silent: until its
// response's headers, and then between two reads of its body, as nginx's
// proxy_read_timeout does. A silent upstream's request is cancelled.
type silenceTransport struct {
	next  http.RoundTripper
	limit time.Duration
}

func (t *silenceTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	timer := time.AfterFunc(t.limit, func() { cancel(errUpstreamTimeout) })
	resp, err := t.next.RoundTrip(r.WithContext(ctx))
	if err != nil {
		timer.Stop()
		if context.Cause(ctx) == errUpstreamTimeout {
			err = errUpstreamTimeout
		}
		cancel(nil)
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// An upgraded stream (WebSocket) is the client's and the
		// upstream's: silence is normal there, and the proxy needs the
		// body's io.ReadWriteCloser. The request's context ends with it.
		timer.Stop()
		return resp, nil
	}
	timer.Reset(t.limit)
	resp.Body = &silenceBody{ReadCloser: resp.Body, ctx: ctx, cancel: cancel, timer: timer, limit: t.limit}
	return resp, nil
}

// silenceBody restarts the silence timer on every read.
type silenceBody struct {
	io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	limit  time.Duration
}

func (b *silenceBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.timer.Reset(b.limit)
	}
	if err != nil && context.Cause(b.ctx) == errUpstreamTimeout {
		err = errUpstreamTimeout
	}
	return n, err
}

func (b *silenceBody) Close() error {
	b.timer.Stop()
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
