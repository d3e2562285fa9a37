package lab

// Op names one step of an Observe, as a trace build reports it.
type Op uint8

// The steps, in the order an Observe can take them.
const (
	Start     Op = iota // the call: hash, tag, bucket(s), tick
	Fast                // Phase 1 on the fast path: one load of the bucket(s) (after a lost CAS, of the slot), one CAS
	Reload              // a slot ahead of the caller's tick: reload the shared tick
	Scrub               // a slot silent for 24+ ticks zeroed (scrub-on-write)
	Refresh             // Phase 1: the key's slot decayed and incremented
	Claim               // Phase 2: an empty or dead slot claimed
	Lottery             // Phase 3: the draw against the weakest slot
	Bounce              // Phase 3: the challenger lost the draw
	Takeover            // Phase 3: a weakest slot of 1 replaced
	Chip                // Phase 3: the weakest slot decremented
	Drain               // a duplicate slot of the key folded into its first
	Exhausted           // 4 CAS attempts lost: the increment is dropped
	Result              // the returned (estimate, first)
)

var opNames = [...]string{
	Start:     "start",
	Fast:      "fast-refresh",
	Reload:    "reload-tick",
	Scrub:     "scrub",
	Refresh:   "refresh",
	Claim:     "claim",
	Lottery:   "lottery",
	Bounce:    "bounce",
	Takeover:  "takeover",
	Chip:      "chip",
	Drain:     "drain",
	Exhausted: "cas-exhausted",
	Result:    "result",
}

// String returns the simulator's name for the step.
func (op Op) String() string {
	if int(op) < len(opNames) {
		return opNames[op]
	}
	return "unknown"
}

// Event is one step. Slot is an index into the key's view: 0-7 its
// bucket, 8-15 its second bucket with TwoChoice; -1 when no slot applies.
// A start's slot is the key's home slot (docs/DESIGN.md, Buckets), -1 with
// TwoChoice.
type Event struct {
	Op     Op
	Slot   int
	Old    uint64 // the word the CAS expected (or the victim, for the lottery)
	New    uint64 // the word the CAS tried to store
	OK     bool   // the CAS won, or the lottery was won
	Tick   int64  // the caller's tick
	Hash   uint64 // start: the key's hash
	Tag    uint16 // start: its fingerprint
	Bucket int    // start: its bucket
	Second int    // start: its second bucket with TwoChoice, else -1
	Est    uint32 // result: the estimate; lottery: the victim's effective count; drain: the slot folded into
	First  bool   // result: the first-sighting flag
	Draw   uint64 // lottery: the draw (HeavyKeeper: the salt; chip: the mixed word)
	Bound  uint64 // lottery: HeavyKeeper wins if Draw < Bound; chip wins if Draw&Bound == 0
	Sure   bool   // lottery: a chip below 9 counts, won without a draw
}

var tracer func(Event)

// SetTracer makes f receive every step of every Observe of every Sketch in
// the process, in trace builds (Traced) only; nil turns tracing off. It is
// meant for a single-threaded simulator: set it before any Observe runs, and
// do not call it concurrently with Observe.
func SetTracer(f func(Event)) { tracer = f }

// Emit reports ev to the tracer, if one is set; package epochsketch calls it
// in trace builds.
func Emit(ev Event) {
	if tracer != nil {
		tracer(ev)
	}
}
