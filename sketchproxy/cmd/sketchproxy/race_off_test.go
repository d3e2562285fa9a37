//go:build !race

package main

import "time"

// rlsDeadline is the deadline of the gRPC calls of the handover test:
// Envoy's default timeout for a rate-limit call.
const rlsDeadline = 20 * time.Millisecond
