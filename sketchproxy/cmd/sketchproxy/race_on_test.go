//go:build race

package main

import "time"

// envoyDeadline is the deadline of the gRPC calls of the handover test's
// long run. The race detector slows the test's own client (not the binary
// it calls, built without it) past Envoy's 20 ms even when nothing is
// handed over; the 20 ms figures come from normal runs.
const envoyDeadline = 100 * time.Millisecond
