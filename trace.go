package epochsketch

import "github.com/epochsketch/epochsketch/internal/lab"

// A trace of one Observe, for the browser simulator. Trace builds
// (go build -tags epochsketch_trace) report every step to the tracer that
// internal/lab's SetTracer sets; in normal builds traceOn is the constant
// false, every hook below sits behind "if traceOn", and the compiler deletes
// them: the hot path's machine code is the same as without them
// (BENCHMARKS.md, "Trace hooks"). The trace's types live in internal/lab, so
// that a trace build does not widen the package's API.

// traceEvent is one step, as internal/lab defines it; the steps are lab's
// Op constants.
type traceEvent = lab.Event
