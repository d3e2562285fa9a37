//go:build !epochsketch_trace

package epochsketch

// traceOn is false in normal builds: every "if traceOn" block is dead code
// and compiled out.
const traceOn = false

func emit(traceEvent) {}

func (s *Sketch) chipWinsTraced(h, victim uint64, eff uint32) bool { panic("unreachable") }

func (s *Sketch) observeTraced(h uint64, now int64, wt uint32) (uint32, bool) { panic("unreachable") }
