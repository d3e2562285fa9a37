package sketchproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// ErrBodyTimeout is the error a request body's reads return once
// server.body_timeout has passed: a reverse proxy's error handler can
// answer 408 for it (cmd/sketchproxy does).
var ErrBodyTimeout = errors.New("sketchproxy: the request body took longer than server.body_timeout")

// prepareBody bounds how long a client may take to send its body and reads
// up to server.buffer_body of it before the upstream is contacted. It
// reports false when it has answered the request itself (408 for a body
// too slow, or nothing for a client that left).
func (m *Middleware) prepareBody(w http.ResponseWriter, r *http.Request, sv *ServerConfig) bool {
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
		m.met.bodyTimeouts.Add(1)
		closeIfBody(w, r)
		writeProblem(w, http.StatusRequestTimeout, "the request body did not arrive within server.body_timeout")
		return false
	default:
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			writeProblem(w, http.StatusRequestEntityTooLarge, "the request body is too large")
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
