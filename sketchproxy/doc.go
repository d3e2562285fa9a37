// Package sketchproxy rate-limits, tarpits and defends wallets in front of
// any http.Handler, in fixed memory: every limit is an EpochSketch, whose
// table never grows with the number of clients.
//
// A [Config] (usually read from YAML with [LoadConfig]) lists rules: each
// matches requests by host, cleaned path and method, builds a key from the
// client address, headers, query parameters or a verified token's claims,
// and applies limits ("100 per minute, burst 20"), a wallet of units per
// period reconciled from the upstream's usage reports, and caps on requests
// in flight. [New] compiles it into a [Middleware] around the next handler;
// every rule decides before anything is counted, and a request is counted
// and charged only when every rule admits it (or, for rules with refused:
// count, whatever the verdict).
//
// A reverse proxy in front of the Middleware's next handler should use
// [Middleware.SetForwarded] to tell the upstream the client and
// [Middleware.Transport] so that wallets are charged what the upstream
// reports in trailers and after a client has gone; cmd/sketchproxy does
// both. [Middleware.MetricsHandler] serves Prometheus metrics,
// [Middleware.Reload] swaps the rules while requests run, and
// [Middleware.SaveState] with Config.StateFile keeps the counts across
// restarts.
//
// The README beside this package starts each way to run it; its docs/
// pages give the limit math and the headers of
// draft-ietf-httpapi-ratelimit-headers-10 (rules-and-limits.md), the
// hostile inputs tested (hostile-inputs.md) and the design (design.md);
// the repository's BENCHMARKS.md gives the measured accuracy and overhead.
package sketchproxy
