//go:build epochsketch_trace

package epochsketch

import "github.com/epochsketch/epochsketch/internal/lab"

// traceOn is true in trace builds (-tags epochsketch_trace), which report each
// step of every Observe to the function set by internal/lab's SetTracer. They
// exist for the browser simulator and for tests; production builds leave the
// tag off and pay nothing.
const traceOn = lab.Traced

func emit(ev traceEvent) { lab.Emit(ev) }

// chipWinsTraced is chipWins, reporting the draw.
func (s *Sketch) chipWinsTraced(h, victim uint64, eff uint32) bool {
	ev := traceEvent{Op: lab.Lottery, Slot: -1, Old: victim, Est: eff}
	if s.lottery == lotteryHeavyKeeper {
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
	emit(traceEvent{Op: lab.Start, Slot: home, Tick: now, Hash: h, Tag: tagFrom(h), Bucket: int(v.shard), Second: second})
	if !s.twoChoice {
		var lost int
		var miss bool
		if est, first, lost, miss = refresh(v.b[0], h, now, wt, countMax); est == 0 {
			est, first = s.observeBucket(v.b[0], v.shard, h, now, wt, lost, miss, noLimit, 1)
		}
	} else {
		est, first = s.observeView(h, now, wt, noLimit, 1)
	}
	emit(traceEvent{Op: lab.Result, Slot: -1, Tick: s.clk.hw.Load(), Est: est, First: first})
	return est, first
}
