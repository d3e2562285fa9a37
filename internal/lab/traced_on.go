//go:build epochsketch_trace

package lab

// Traced is true in trace builds (go build -tags epochsketch_trace), where
// every Observe reports its steps to the function set by SetTracer.
const Traced = true
