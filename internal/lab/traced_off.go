//go:build !epochsketch_trace

package lab

// Traced is false in normal builds: package epochsketch compiles its trace
// hooks out, and SetTracer's function is never called.
const Traced = false
