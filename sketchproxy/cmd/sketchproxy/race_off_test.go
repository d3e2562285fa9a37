//go:build !race

package main

import "time"

// envoyDeadline is the deadline of the gRPC calls of the handover test's
// long run: Envoy's default timeout for a rate-limit call.
const envoyDeadline = 20 * time.Millisecond
