package epochsketch

// A trace of one Observe, for the browser simulator. Trace builds
// (go build -tags epochsketch_trace) report every step to a tracer; in
// normal builds traceOn is the constant false, every hook below sits behind
// "if traceOn", and the compiler deletes them: the hot path's machine code is
// the same as without them (BENCHMARKS.md, "Trace hooks").

// traceOp names one step of an Observe.
type traceOp uint8

const (
	traceStart     traceOp = iota // the call: hash, tag, bucket(s), tick
	traceFast                     // Phase 1 on the fast path: one load of the bucket(s) (after a lost CAS, of the slot), one CAS
	traceReload                   // a slot ahead of the caller's tick: reload the shared tick
	traceScrub                    // a slot silent for 24+ ticks zeroed (scrub-on-write)
	traceRefresh                  // Phase 1: the key's slot decayed and incremented
	traceClaim                    // Phase 2: an empty or dead slot claimed
	traceLottery                  // Phase 3: the draw against the weakest slot
	traceBounce                   // Phase 3: the challenger lost the draw
	traceTakeover                 // Phase 3: a weakest slot of 1 replaced
	traceChip                     // Phase 3: the weakest slot decremented
	traceDrain                    // a duplicate slot of the key folded into its first
	traceExhausted                // 4 CAS attempts lost: the increment is dropped
	traceResult                   // the returned (estimate, first)
)

var traceOpNames = [...]string{
	traceStart:     "start",
	traceFast:      "fast-refresh",
	traceReload:    "reload-tick",
	traceScrub:     "scrub",
	traceRefresh:   "refresh",
	traceClaim:     "claim",
	traceLottery:   "lottery",
	traceBounce:    "bounce",
	traceTakeover:  "takeover",
	traceChip:      "chip",
	traceDrain:     "drain",
	traceExhausted: "cas-exhausted",
	traceResult:    "result",
}

func (op traceOp) String() string {
	if int(op) < len(traceOpNames) {
		return traceOpNames[op]
	}
	return "unknown"
}

// traceEvent is one step. Slot is an index into the key's view: 0-7 its
// bucket, 8-15 its second bucket with TwoChoice; -1 when no slot applies.
// A start's slot is the key's home slot (docs/DESIGN.md, Buckets), -1 with
// TwoChoice.
type traceEvent struct {
	Op     traceOp
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
