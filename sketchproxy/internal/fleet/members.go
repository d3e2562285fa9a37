package fleet

import (
	"fmt"
	"math"
	"os"
	"time"

	"github.com/epochsketch/epochsketch/sketchproxy/config"
	"github.com/epochsketch/epochsketch/sketchproxy/internal/engine"
)

// How a replica counts its peers (docs/fleets.md, How a replica counts
// its peers): replicas if set; else the replicas that heartbeat, never
// fewer than the most seen lately; while Redis is unreachable, the most
// seen lately, at least min_replicas. The most seen is kept in the state
// file (and the handover's), so that a replica restarted while Redis is
// unreachable starts from the last membership it saw, not from
// UnknownReplicas.

// fleetPeakKept is how long the most replicas seen is kept for the state
// file once fewer are counted: an hour, longer than a rolling restart or
// a whole fleet's stop one replica after another (the last to stop has
// seen the others leave, and must not keep 1), and short enough that a
// fleet scaled down is counted as it is the next hour.
const fleetPeakKept = time.Hour

// notePeak records that n replicas were counted at now (f.now ns, seenMu
// held).
func (f *Fleet) notePeak(n, now int64) {
	if n >= f.peak || now-f.peakAt > int64(fleetPeakKept) {
		f.peak, f.peakAt = n, now
	}
}

// Members is engine.FleetMembers: the most replicas seen within
// fleetPeakKept, for the state file, and when they were last counted.
func (f *Fleet) Members() (int, time.Time) {
	f.seenMu.Lock()
	defer f.seenMu.Unlock()
	if f.peak == 0 {
		return 0, time.Time{}
	}
	return int(f.peak), time.Unix(0, f.peakAt)
}

// RestoreMembers is engine.FleetMembers: the membership a state file kept
// counts as seen now, so that it is N's floor while Redis is unreachable
// and, once Redis answers, for the two windows of noteMembers, like any
// count seen; it is kept for the next state file as seen at.
func (f *Fleet) RestoreMembers(n int, at time.Time) {
	if n <= 0 {
		return
	}
	f.seenMu.Lock()
	f.seenCur.Store(max(f.seenCur.Load(), int64(n)))
	f.seen.Store(max(f.seen.Load(), int64(n)))
	if f.seenAt.Load() == 0 {
		f.seenAt.Store(f.now().UnixNano())
	}
	if int64(n) > f.peak {
		f.peak, f.peakAt = int64(n), at.UnixNano()
	}
	f.seenMu.Unlock()
	if f.cfg.Replicas == 0 {
		f.log.Info("fleet: the last membership seen is restored: this replica assumes at least that many replicas until Redis counts them", "replicas", n, "seen", at.UTC().Format(time.RFC3339))
	}
}

var _ engine.FleetMembers = (*Fleet)(nil)

// sizeUnknown reports whether N falls back to UnknownReplicas now:
// Redis is unreachable, and neither replicas, min_replicas nor any count
// seen (or restored) says how many replicas run.
func (f *Fleet) sizeUnknown() bool {
	return f.cfg.Replicas == 0 && f.cfg.MinReplicas == 0 && f.seen.Load() == 0 && !f.up.Load()
}

// warnSizeUnknown says, once, that this replica decides with N =
// UnknownReplicas and what to set instead.
func (f *Fleet) warnSizeUnknown() {
	if f.sizeUnknown() && !f.sizeWarned.Swap(true) {
		f.log.Warn("fleet: Redis is unreachable and the number of replicas unknown: " + fleetSizeAdvice("fleet.min_replicas", "fleet.replicas"))
	}
}

// fleetSizeAdvice says what a fleet that does not know its size assumes
// and what to set (minReplicas and replicas, named as the config names
// them).
func fleetSizeAdvice(minReplicas, replicas string) string {
	return fmt.Sprintf("a replica that has not reached Redis assumes %d replicas, so a fleet of N started while Redis is down admits N/%d times the limit until Redis answers (1.5 times for 3); set %s to the number of replicas you run (or %s to fix N)",
		UnknownReplicas, UnknownReplicas, minReplicas, replicas)
}

// SizeWarning is the warning for a fleet section that gives neither
// replicas nor min_replicas, where the state file keeps no membership
// either (a first start, or no state_file), or that gives both (replicas
// fixes N): "" for none. cmd/sketchproxy
// logs it at start, and -check prints it.
func SizeWarning(cfg *config.Config) string {
	f := cfg.Fleet
	if f != nil && f.Replicas > 0 && f.MinReplicas > 0 {
		return fmt.Sprintf("fleet.min_replicas: %d is ignored: replicas: %d fixes N whether Redis answers or not; remove one of them", f.MinReplicas, f.Replicas)
	}
	if f == nil || f.Replicas > 0 || f.MinReplicas > 0 {
		return ""
	}
	if cfg.StateFile != "" {
		if fh, err := os.Open(cfg.StateFile); err == nil {
			n, _, err := engine.ReadMembers(fh)
			fh.Close()
			if err == nil && n > 0 {
				return "" // restored at start (RestoreMembers)
			}
		}
	}
	where := "there is no state_file to keep the last membership seen"
	if cfg.StateFile != "" {
		where = "the state_file keeps no membership yet"
	}
	return "fleet: neither replicas nor min_replicas is set and " + where + ": " + fleetSizeAdvice("fleet.min_replicas", "fleet.replicas")
}

// fleetWarmPoint is the promotion point during the warm-up (fleet.warmUntil,
// stale() from a replica's first answer from Redis): two requests, so a
// key joins the hot set at its third request here, not past
// promote_fraction × θ/N. A replica that starts has counted nothing,
// while the others may hold a key at θ; below the usual point it would
// add that much of it unseen at each restart (p/2 + 1 requests: 5 of a
// burst of 40 for one of 2 replicas). One-off keys stay mice, and cost
// Redis nothing, even where refused requests count (the engine then asks
// with the request already in the local count: 2 + 2 counts). A key whose
// tag is in the index of heavy keys (index.go) joins at its first request:
// the two before its third added two requests of a key held at its limit
// at each restart.
const fleetWarmPoint = 2 * shareUnit

// othersKnown is the count of key skey (of a limit of tick and theta) that
// the other replicas held at this replica's last word from Redis, halved
// to now, plus local: what the key's count is at least, fleet-wide. 0 for
// a key not hot here or not yet answered.
func (f *Fleet) othersKnown(skey []byte, sk engine.Local, tick time.Duration, theta, local uint32, now time.Time) uint32 {
	s := f.shard(skey)
	s.mu.Lock()
	e := s.m[string(skey)]
	s.mu.Unlock()
	if e == nil || e.sk != sk || e.tick != tick || e.theta != theta {
		return 0
	}
	v := e.view.Load()
	if v == nil {
		return 0
	}
	return v.withOthers(local, now.UnixNano()/int64(tick))
}

// withOthers is local plus the other replicas' counts in v, halved to
// tick tk: what a key's count is at least, fleet-wide.
func (v *shareView) withOthers(local uint32, tk int64) uint32 {
	sum := uint64(local)
	for _, p := range v.others {
		sum += uint64(halve(p.c, tk-v.tick))
	}
	return uint32(min(sum, math.MaxUint32))
}
