package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/health"

	"github.com/epochsketch/epochsketch/sketchproxy"
)

// running is what run sets up for serve, reload and the watcher.
type running struct {
	// current is the config running now: the watcher compares its
	// envoy_rls.directory with the files.
	current atomic.Pointer[sketchproxy.Config]
	// changed carries the reloads the watcher asks serve for; hup and
	// usr2 the signals, caught from the start.
	changed   chan struct{}
	hup, usr2 chan os.Signal
	// sockets are the inherited listening sockets no listener has taken
	// yet (handover.go); listeners are every listener, by door, for a
	// handover; ready is a predecessor's handover pipe and handedState the
	// state it handed over (nil: none).
	sockets     map[string]net.Listener
	listeners   map[string]net.Listener
	ready       *os.File
	handedState *os.File
	// draining is set when a graceful stop starts: /healthz answers 503;
	// health is the gRPC health service, NOT_SERVING from then on.
	draining atomic.Bool
	health   *health.Server
	// closing is set once a handover's successor serves: HTTP answers
	// close their connections; conns counts the proxy's and the check's
	// open HTTP connections (newServer).
	closing atomic.Bool
	conns   atomic.Int64
	// lastReloadErr is the last reload's error ("": it succeeded), so
	// that the watcher's retries of one failure log it once (serve's
	// goroutine only).
	lastReloadErr string
}

// maxRetryLooks bounds the backoff between retries of a directory's
// reload that did not take, in looks: about a minute at the default
// watch_every of 1s.
const maxRetryLooks = 64

// watch looks, every envoy_rls.watch_every until ctx ends, at what a
// reload would read and the running config has not: envoy_rls.directory's
// files (a change asks serve for a reload on o.changed, as SIGHUP does)
// and the gRPC listener's TLS files (loaded here, for new connections).
// It polls rather than asking the kernel for events: a ConfigMap's swap is
// a rename of a link in the directory above the files, which a watch on
// the files misses, and a look at a few small files a second costs
// nothing. Each broken state is logged once, not at every look.
//
// A reload can fail for a reason outside the directory (a broken TLS
// file, the main config): the directory's new contents are then not
// live, and a later fix elsewhere changes nothing the watcher compares.
// So until what is loaded is what the directory holds, the reload is
// asked for again: at once when the TLS files have just reloaded, else
// after 1, 2, 4, ... looks, up to maxRetryLooks.
func (o *options) watch(ctx context.Context, every time.Duration, tlsw *sketchproxy.GRPCTLS, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var asked, lastErr string // the digest last reloaded for; the error last logged
	wait, retryIn := 1, 0     // the backoff and the looks until the next retry
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		tlsChanged := false
		if tlsw != nil {
			switch changed, err := tlsw.Reload(); {
			case err != nil:
				log.Error("tls: new files not loaded: keeping the running certificate", "err", err.Error())
			case changed:
				tlsChanged = true
				log.Info("tls: certificate reloaded from its files: new connections use it")
			}
		}
		cur := o.current.Load()
		d, err := cur.RLSDirectoryDigest()
		if err != nil {
			if err.Error() != lastErr {
				log.Error("envoy_rls.directory unreadable: keeping the running config", "err", err.Error())
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		switch {
		case d == cur.EnvoyRLS.LoadedDirectoryDigest():
			asked, wait = "", 1 // live
			continue
		case d != asked: // new contents
			asked, wait, retryIn = d, 1, 1
			log.Info("envoy_rls.directory changed: reloading", "directory", cur.EnvoyRLS.Directory)
		default: // asked for, and still not live: that reload failed
			if retryIn--; retryIn > 0 && !tlsChanged {
				continue
			}
			wait = min(2*wait, maxRetryLooks)
			retryIn = wait
			log.Debug("envoy_rls.directory not live yet: reloading again", "directory", cur.EnvoyRLS.Directory, "next_retry_looks", wait)
		}
		select {
		case o.changed <- struct{}{}:
		default: // a reload is pending: it reads the newest files
		}
	}
}
