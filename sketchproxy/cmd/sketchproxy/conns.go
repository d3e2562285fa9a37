package main

import (
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/connlimit"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// The admin listener's caps: Prometheus and health checks hold a few
// connections; at most a sixteenth of the descriptors in all.
const (
	adminMaxConns        = 64
	adminMaxConnsPerPeer = 8
)

// descriptorLimit is the process's file descriptor limit (RLIMIT_NOFILE,
// which the Go runtime raises to its hard limit at start), or 0 where it
// cannot be read.
func descriptorLimit() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<30 {
		return 0
	}
	return int(rl.Cur)
}

// grpcConnLimits are the gRPC listener's caps for a descriptor limit of
// nofile (0: unknown): envoy_rls.max_connections, or a quarter of nofile,
// and never more than half of it, so that 21,000 connections of one kind
// can no longer take all 20,000 descriptors from the HTTP doors; lowered
// reports a configured value that was lowered.
func grpcConnLimits(r *sketchproxy.EnvoyRLSConfig, nofile int) (lim connlimit.Limits, lowered bool) {
	lim = connlimit.Limits{Total: r.MaxConnections, PerPeer: *r.MaxConnectionsPerClient}
	if nofile <= 0 {
		return lim, false
	}
	if lim.Total == 0 {
		lim.Total = max(nofile/4, 1)
	}
	if half := max(nofile/2, 1); lim.Total > half {
		return connlimit.Limits{Total: half, PerPeer: lim.PerPeer}, true
	}
	return lim, false
}

// adminConnLimits are the admin listener's caps for a descriptor limit of
// nofile (0: unknown).
func adminConnLimits(nofile int) connlimit.Limits {
	lim := connlimit.Limits{Total: adminMaxConns, PerPeer: adminMaxConnsPerPeer}
	if nofile > 0 {
		lim.Total = max(min(lim.Total, nofile/16), 1)
	}
	return lim
}

// capListener wraps ln with lim; the connections it closes at accept are
// logged, 5 lines a second at most, with the count of those left out.
func capListener(ln net.Listener, name string, lim connlimit.Limits, log *slog.Logger) *connlimit.Listener {
	cl := connlimit.New(ln, lim)
	var logs engine.LogLimiter
	cl.OnRefuse = func(peer netip.Addr, reason string) {
		if ok, skipped := logs.Allow(time.Now(), 5); ok {
			log.Warn("connection closed at accept", "listener", name, "peer", peer.String(), "cap", reason,
				"max_connections", lim.Total, "max_connections_per_client", lim.PerPeer, "skipped", skipped)
		}
	}
	return cl
}
