#!/usr/bin/env bash
# The multi-core scaling run (BENCHMARKS.md, "Core: scaling across cores"):
# Observe and the peers on parallel workloads at GOMAXPROCS 1 to 16.
#
#   scripts/scaling.sh build        # here: compile the two test binaries into scaling-bin/
#   scripts/scaling.sh run [OUT]    # on the many-core machine (no Go needed): about 6 minutes on 16 cores
#   scripts/scaling.sh report [OUT] # here: benchstat tables from OUT (default bench/scaling)
set -euo pipefail
cd "$(dirname "$0")/.."
cpus=${CPUS:-1,2,4,8,12,16}
case "${1:-}" in
build)
  mkdir -p scaling-bin
  go test -c -o scaling-bin/core.test .
  (cd bench && go test -c -o ../scaling-bin/peers.test .)
  ;;
run)
  out=${2:-${OUT:-bench/scaling}}
  mkdir -p "$out"
  nproc > "$out/nproc.txt"
  ./scaling-bin/core.test -test.run XXX -test.bench 'BenchmarkObserveParallel' -test.benchtime 200ms \
    -test.cpu "$cpus" -test.count 6 > "$out/core.txt"
  ./scaling-bin/core.test -test.run XXX -test.bench 'BenchmarkObserveContended' -test.benchtime 200ms \
    -test.cpu "$cpus" -test.count 6 > "$out/contended.txt"
  (cd bench && ../scaling-bin/peers.test -test.run XXX -test.bench 'BenchmarkPeersParallel' -test.benchtime 100ms \
    -test.cpu "$cpus" -test.count 6) > "$out/peers.txt"
  ;;
report)
  out=${2:-bench/scaling}
  go install golang.org/x/perf/cmd/benchstat@latest
  bs="$(go env GOPATH)/bin/benchstat"
  cat "$out/nproc.txt"
  # ns/op per workload (rows) and GOMAXPROCS (columns), one table per implementation.
  "$bs" -row /workload -col /gomaxprocs -table /impl "$out/core.txt"
  "$bs" -row /workload -col /gomaxprocs -table /impl "$out/peers.txt"
  # one hot key shared by every goroutine: time per call and the tail of single calls.
  "$bs" -col /gomaxprocs "$out/contended.txt"
  ;;
*)
  echo "usage: scripts/scaling.sh build | run [OUT] | report [OUT]" >&2
  exit 2
  ;;
esac
