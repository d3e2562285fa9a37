package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// drain starts a graceful stop: the gRPC health service reports
// NOT_SERVING and /healthz answers 503, and for -drain every listener keeps
// answering, so that load balancers and Envoy move traffic away before the
// listeners close. A second SIGINT or SIGTERM cuts the drain short.
func (o *options) drain(log *slog.Logger) {
	o.draining.Store(true)
	if o.health != nil {
		o.health.Shutdown()
	}
	if o.drainFor <= 0 {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	log.Info("draining: health reports NOT_SERVING, requests are still answered", "drain", o.drainFor.String())
	t := time.NewTimer(o.drainFor)
	defer t.Stop()
	select {
	case <-t.C:
	case s := <-sig:
		log.Info("draining cut short", "signal", s.String())
	}
}
