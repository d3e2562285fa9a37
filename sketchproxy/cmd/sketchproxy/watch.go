package main

import (
	"context"
	"log/slog"
	"net"
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
	// changed carries the reloads the watcher asks serve for.
	changed chan struct{}
	// sockets are the inherited listening sockets no listener has taken
	// yet (handover.go).
	sockets map[string]net.Listener
	// draining is set when a graceful stop starts: /healthz answers 503;
	// health is the gRPC health service, NOT_SERVING from then on.
	draining atomic.Bool
	health   *health.Server
}

// watch looks, every envoy_rls.watch_every until ctx ends, at what a
// reload would read and the running config has not: envoy_rls.directory's
// files (a change asks serve for a reload on o.changed, as SIGHUP does)
// and the gRPC listener's TLS files (loaded here, for new connections).
// It polls rather than asking the kernel for events: a ConfigMap's swap is
// a rename of a link in the directory above the files, which a watch on
// the files misses, and a look at a few small files a second costs
// nothing. Each broken state is logged once, not at every look.
func (o *options) watch(ctx context.Context, every time.Duration, tlsw *sketchproxy.GRPCTLS, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	var asked, lastErr string // the digest last reloaded for; the error last logged
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if tlsw != nil {
			switch changed, err := tlsw.Reload(); {
			case err != nil:
				log.Error("tls: new files not loaded: keeping the running certificate", "err", err.Error())
			case changed:
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
		if d == cur.EnvoyRLS.LoadedDirectoryDigest() || d == asked {
			continue
		}
		asked = d
		log.Info("envoy_rls.directory changed: reloading", "directory", cur.EnvoyRLS.Directory)
		select {
		case o.changed <- struct{}{}:
		default: // a reload is pending: it reads the newest files
		}
	}
}
