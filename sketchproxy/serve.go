package sketchproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// ServeHTTP decides and then proxies, holds, or refuses the request.
//
// Every rule decides first, counting nothing. A request that every rule
// admits is then counted in every limit and charged to every wallet; a
// refused one is counted only by rules with refused: count, and charged to
// no wallet (engine.Decide).
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.checkHere(r.URL.Path) {
		m.forwardAuth(w, r) // the check's path, in any spelling, is never proxied
		return
	}
	m.serve(w, r, m.next, nil)
}

// checkHere reports whether p is the forward-auth check's path on the
// proxy's own listener: under the running config, or under the config the
// Middleware started with (a reload that moves the check to a listener of
// its own, or removes it, takes a restart to free the path here: until
// then it is answered by the check, never proxied).
func (m *Middleware) checkHere(p string) bool {
	if fa := m.state.Load().cfg.ForwardAuth; fa != nil && fa.Listen == "" && isCheck(fa, p) {
		return true
	}
	return m.startCheck != nil && isCheck(m.startCheck, p)
}

// check is what a forward-auth check adds to the request it judges.
type check struct {
	alt []string // hosts besides Host that a gateway not named may route on
}

// serve decides r and hands an admitted request to next. A check (the
// forward-auth endpoint) refuses with forward_auth.refusal_status and never
// drips.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, chk *check) {
	st := m.state.Load()
	now := m.now()
	begin := time.Now()
	m.met.requests.Add(1)
	var req request // on the stack, with room for the matched rules
	var room [8]*rule
	rq := &req
	var alt []string
	if chk != nil {
		alt = chk.alt
	}
	matched, ok := m.screen(w, r, st, rq, alt, room[:0])
	if !ok {
		return
	}
	defer rq.free()
	if chk != nil && st.cfg.ForwardAuth != nil {
		rq.refusal = st.cfg.ForwardAuth.RefusalStatus
	}
	if len(matched) > 0 {
		defer func() {
			d := time.Since(begin).Seconds()
			for _, ru := range matched {
				ru.latency.Observe(d)
			}
		}()
	}
	d := m.decide(r, st, matched, rq, now, chk != nil)
	defer d.Done()
	for i := range d.Verdicts {
		if v := &d.Verdicts[i]; v.Shadow && v.Out.Refuses() {
			m.logDecision(r, v, true, v.Never)
		}
	}
	switch {
	case d.Gone: // the client went away while the tarpit held it
	case !d.Admitted:
		if d.Worst.Rule == nil {
			d.Worst.Key = rq.client // the per-client cap refused: its key, for the log
		}
		m.refuse(w, r, st, &d, refusal{code: rq.refusalCode(&d)})
	default:
		m.forward(w, r, next, st, &d)
	}
}

// decide hands the request's facts to the engine: for each matched rule,
// the request's key under it and whether the rule's allow list exempts it.
func (m *Middleware) decide(r *http.Request, st *state, matched []*rule, rq *request, now time.Time, check bool) engine.Decision {
	rq.client = st.ci.group(rq.addr)
	var room [8]engine.Fact
	facts := room[:0]
	for _, ru := range matched {
		key := ru.keyOf(rq)
		facts = append(facts, engine.Fact{Rule: ru.eng, Key: key, Allowlisted: ru.allowlisted(rq.addr, key)})
	}
	return m.eng.Decide(r.Context(), st.set, now, &engine.Request{
		Facts: facts, Client: rq.client, ClientCap: *st.cfg.Server.MaxInFlightPerClient, NoDrip: check,
	}, rq.sc)
}

// forward sends an admitted request on: the rate-limit fields, the body's
// deadline and buffer, the wallets' settlements, then the next handler.
func (m *Middleware) forward(w http.ResponseWriter, r *http.Request, next http.Handler, st *state, d *engine.Decision) {
	if !st.cfg.Headers.Off {
		m.setHeaders(w.Header(), st, &d.Fields)
	}
	if !m.prepareBody(w, r, st) {
		return
	}
	m.met.inFlight.Add(1)
	defer m.met.inFlight.Add(-1)
	if len(d.Wallets) > 0 {
		rcs := make(settlements, len(d.Wallets))
		for i, wl := range d.Wallets {
			rcs[i] = &settlement{m: m, w: wl}
		}
		var done func()
		r, done = m.detach(r, rcs)
		rw := &reconcileWriter{ResponseWriter: w, rcs: rcs}
		defer func() {
			// Usage sent as a trailer is in the header map now; whatever
			// was never reported, Done releases the reservation (unless a
			// drain of the response still looks for the report).
			rcs.settle(rw.Header(), true)
			done()
		}()
		w = rw
	}
	next.ServeHTTP(w, r)
}

// reconcileWriter settles a request's wallets from the response header
// when the response starts (and, after the handler, from its trailers).
type reconcileWriter struct {
	http.ResponseWriter
	rcs  settlements
	done bool
}

func (rw *reconcileWriter) WriteHeader(code int) {
	if !rw.done && code >= 200 {
		rw.done = true
		rw.rcs.settle(rw.ResponseWriter.Header(), false)
	}
	rw.ResponseWriter.WriteHeader(code)
}

func (rw *reconcileWriter) Write(p []byte) (int, error) {
	if !rw.done {
		rw.WriteHeader(http.StatusOK)
	}
	return rw.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach Flush and Hijack (SSE,
// WebSocket).
func (rw *reconcileWriter) Unwrap() http.ResponseWriter { return rw.ResponseWriter }

// ErrBodyTimeout is the error a request body's reads return once
// server.body_timeout has passed: a reverse proxy's error handler can
// answer 408 for it (cmd/sketchproxy does).
var ErrBodyTimeout = errors.New("sketchproxy: the request body took longer than server.body_timeout")

// prepareBody bounds how long a client may take to send its body and reads
// up to server.buffer_body of it before the upstream is contacted. It
// reports false when it has answered the request itself (408 for a body
// too slow, or nothing for a client that left).
func (m *Middleware) prepareBody(w http.ResponseWriter, r *http.Request, st *state) bool {
	sv := &st.cfg.Server
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return true
	}
	rc := http.NewResponseController(w)
	// Best effort: a ResponseWriter that cannot (a test recorder) has no
	// connection to hold.
	deadlineSet := rc.SetReadDeadline(time.Now().Add(time.Duration(sv.BodyTimeout))) == nil
	body := &deadlineBody{ReadCloser: r.Body, rc: rc, active: deadlineSet}
	r.Body = body
	n := *sv.BufferBody
	if n == 0 {
		return true
	}
	var buf bytes.Buffer
	_, err := io.CopyN(&buf, body, int64(n)+1)
	switch {
	case err == io.EOF:
		// The whole body: the upstream gets it at once, with its length.
		r.Body = readCloser{bytes.NewReader(buf.Bytes()), body}
		r.ContentLength = int64(buf.Len())
		r.TransferEncoding = nil
		return true
	case err == nil:
		// Longer than the buffer: what came first, then the rest as it comes.
		r.Body = readCloser{io.MultiReader(&buf, body), body}
		return true
	case errors.Is(err, ErrBodyTimeout):
		m.refuse(w, r, st, nil, refusal{code: http.StatusRequestTimeout, why: "the request body did not arrive within server.body_timeout"})
		return false
	default:
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			m.refuse(w, r, st, nil, refusal{code: http.StatusRequestEntityTooLarge, why: "the request body is too large"})
		}
		return false // the client went away, or sent a broken body
	}
}

type readCloser struct {
	io.Reader
	io.Closer
}

// deadlineBody clears the read deadline once the body has been read, so
// that a long response (a stream) is not cut when it passes, and turns the
// deadline's timeout into ErrBodyTimeout.
type deadlineBody struct {
	io.ReadCloser
	rc     *http.ResponseController
	active bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == nil {
		return n, nil
	}
	if b.active {
		b.active = false
		b.rc.SetReadDeadline(time.Time{})
	}
	var ne net.Error
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return n, ErrBodyTimeout
	}
	return n, err
}

func (m *Middleware) now() time.Time {
	if m.opts.Clock != nil {
		return m.opts.Clock.Now()
	}
	return time.Now()
}
