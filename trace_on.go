//go:build epochsketch_trace

package epochsketch

// traceOn is true in trace builds (-tags epochsketch_trace), which report each
// step of every Observe to the function set by SetTracer. They exist for the
// browser simulator and for tests; production builds leave the tag off and
// pay nothing.
const traceOn = true

// TraceEvent is one step of an Observe, in trace builds only.
type TraceEvent = traceEvent

// TraceOp names a step; its String method gives the simulator's names.
type TraceOp = traceOp

// The steps, in the order an Observe can take them.
const (
	TraceStart     = traceStart
	TraceFast      = traceFast
	TraceReload    = traceReload
	TraceScrub     = traceScrub
	TraceRefresh   = traceRefresh
	TraceClaim     = traceClaim
	TraceLottery   = traceLottery
	TraceBounce    = traceBounce
	TraceTakeover  = traceTakeover
	TraceChip      = traceChip
	TraceDrain     = traceDrain
	TraceExhausted = traceExhausted
	TraceResult    = traceResult
)

var tracer func(TraceEvent)

// SetTracer makes f receive every step of every Observe of every Sketch in
// the process, in trace builds only; nil turns tracing off. It is meant for a
// single-threaded simulator: set it before any Observe runs, and do not call
// it concurrently with Observe.
func SetTracer(f func(TraceEvent)) { tracer = f }

func emit(ev traceEvent) {
	if tracer != nil {
		tracer(ev)
	}
}

// chipWinsTraced is chipWins, reporting the draw.
func (s *Sketch) chipWinsTraced(h, victim uint64, eff uint32) bool {
	ev := traceEvent{Op: traceLottery, Slot: -1, Old: victim, Est: eff}
	if s.lottery == LotteryHeavyKeeper {
		if int(eff) < len(hkThreshold) {
			ev.Draw, ev.Bound = s.salt(), hkThreshold[eff]
			ev.OK = ev.Draw < ev.Bound
		}
	} else if eff < chipStep {
		ev.OK, ev.Sure = true, true
	} else {
		ev.Draw = (h ^ victim ^ s.salt()) * drawMix // one salt, as chipWins
		ev.Bound = ^uint64(0)
		if k := eff / chipStep; k < 64 {
			ev.Bound <<= 64 - k
			ev.OK = ev.Draw&ev.Bound == 0
		}
	}
	emit(ev)
	return ev.OK
}

// observeTraced is observe between a start and a result event.
func (s *Sketch) observeTraced(h uint64, now int64, wt uint32) (est uint32, first bool) {
	v := s.viewOf(h)
	second := -1
	if v.n > slotsPerBucket {
		second = int(s.second(h))
	}
	home := -1 // the start's slot is the key's home slot, which TwoChoice has not
	if !s.twoChoice {
		home = homeOf(h)
	}
	emit(traceEvent{Op: traceStart, Slot: home, Tick: now, Hash: h, Tag: tagFrom(h), Bucket: int(v.shard), Second: second})
	if !s.twoChoice {
		var lost int
		var miss bool
		if est, first, lost, miss = refresh(v.b[0], h, now, wt); est == 0 {
			est, first = s.observeBucket(v.b[0], v.shard, h, now, wt, lost, miss, noLimit)
		}
	} else {
		est, first = s.observeView(h, now, wt, noLimit)
	}
	emit(traceEvent{Op: traceResult, Slot: -1, Tick: s.clk.hw.Load(), Est: est, First: first})
	return est, first
}
