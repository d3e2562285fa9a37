#!/usr/bin/env bash
# Benchmarks the core at a git revision against the working tree, side by
# side: both test binaries built first, then 6 interleaved runs of each, so
# machine noise falls on both. Usage:
#   scripts/bench-vs.sh REV [BENCH-REGEX] [OUT-PREFIX]
# e.g. the simulator's trace hooks (BENCHMARKS.md):
#   scripts/bench-vs.sh c111b43 'BenchmarkObserve$/.*/.*/impl=(observe|observe-twochoice)$' bench/core/trace-hooks
# BENCH_CPU sets -test.cpu for both, e.g. BENCH_CPU=1,2 for the parallel
# benchmarks.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/bench-vs.sh REV [BENCH-REGEX] [OUT-PREFIX]}
re=${2:-'BenchmarkObserve$'}
out=${3:-/tmp/bench-vs}
tmp=$(mktemp -d); trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git worktree add -f "$tmp/base" "$rev" >/dev/null 2>&1
(cd "$tmp/base" && go test -c -o "$tmp/before.test" .)
go test -c -o "$tmp/after.test" .
: > "$out-before.txt"; : > "$out-after.txt"
for _ in 1 2 3 4 5 6; do
  "$tmp/before.test" -test.run XXX -test.bench "$re" -test.benchtime=300ms ${BENCH_CPU:+-test.cpu "$BENCH_CPU"} >> "$out-before.txt"
  "$tmp/after.test" -test.run XXX -test.bench "$re" -test.benchtime=300ms ${BENCH_CPU:+-test.cpu "$BENCH_CPU"} >> "$out-after.txt"
done
go install golang.org/x/perf/cmd/benchstat@latest
"$(go env GOPATH)/bin/benchstat" "$out-before.txt" "$out-after.txt" | tee "$out.txt"
