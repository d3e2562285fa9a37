#!/usr/bin/env bash
# Reruns every benchmark of BENCHMARKS.md: the core against its floors, and
# every peer on the same streams, medians of 6 runs, into bench/core and
# bench/peers; then prints the benchstat tables. About 15 minutes on 2 cores.
# CI runs the reduced variant instead: (cd bench && go test ./...).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v bible >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bible-kjv >/dev/null; }
go install golang.org/x/perf/cmd/benchstat@latest
bs="$(go env GOPATH)/bin/benchstat"
mkdir -p bench/core bench/peers

go test -run XXX -bench 'BenchmarkObserve$/.*/.*/impl=(floor-hash-cas|floor-hash-bucket-cas|observe|observe-twochoice|estimate)$' -benchtime=300ms -count=6 . > bench/core/observe.txt
go test -run XXX -bench 'BenchmarkObserveParallel' -benchtime=300ms -cpu 1,2 -count=6 . > bench/core/parallel.txt
go test -run XXX -bench 'BenchmarkObserveMany' -benchtime=300ms -count=6 . > bench/core/observe-many.txt
go test -run XXX -bench 'BenchmarkLiveHeap' -benchtime=1x -count=1 . > bench/core/liveheap.txt
(cd bench &&
  go test -run XXX -bench 'BenchmarkPeers$' -benchtime=300ms -count=6 . > peers/single.txt &&
  go test -run XXX -bench 'BenchmarkPeersParallel' -benchtime=300ms -cpu 1,2 -count=6 . > peers/parallel.txt &&
  go test -run XXX -bench 'BenchmarkLiveHeap' -benchtime=1x -count=1 . > peers/liveheap.txt)

# Package limit: six rounds of one run each, so that the load of a shared
# machine drifts over every row alike.
: > bench/core/limit-allow.txt
: > bench/peers/limiters.txt
for _ in 1 2 3 4 5 6; do
  go test -run XXX -bench 'BenchmarkAllow' -benchtime=300ms -benchmem ./limit >> bench/core/limit-allow.txt
done
for _ in 1 2 3 4 5 6; do
  (cd bench && go test -run XXX -bench 'BenchmarkLimiters' -benchtime=300ms -benchmem . >> peers/limiters.txt)
done

(cd bench && go run ./cmd/accuracy > peers/accuracy.md && go run ./cmd/benchplot)

"$bs" -col /impl bench/core/observe.txt
"$bs" -col /impl bench/core/parallel.txt
"$bs" -col /impl bench/core/observe-many.txt
"$bs" -col /impl bench/peers/single.txt
"$bs" -col /impl bench/peers/parallel.txt
cat bench/peers/liveheap.txt
"$bs" -filter '.name:Allow' -col /impl bench/core/limit-allow.txt
"$bs" -filter '.name:AllowTurns' bench/core/limit-allow.txt
"$bs" -row /workload -col /impl -filter '/case:allow' bench/peers/limiters.txt
"$bs" -row /impl -col /case,/over,/keys -filter '/case:(heap OR admitted)' bench/peers/limiters.txt
