//go:build race

package main

import "time"

// rlsDeadline is the deadline of the gRPC calls of the handover test. The
// race detector slows the test's own client (not the binary it calls,
// built without it) past Envoy's 20 ms even when nothing is handed over;
// the 20 ms figures come from normal runs.
const rlsDeadline = 100 * time.Millisecond
