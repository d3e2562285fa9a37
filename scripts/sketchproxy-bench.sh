#!/usr/bin/env bash
# SketchProxy's overhead, two ways (BENCHMARKS.md, "SketchProxy: overhead"):
# 1. go test -bench: real HTTP clients on loopback against the upstream
#    alone, a plain reverse proxy and SketchProxy, medians of 6, benchstat;
# 2. wrk (Debian's wrk) against the demo upstream alone and through the
#    sketchproxy binary, 10 s each, latency percentiles.
set -euo pipefail
cd "$(dirname "$0")/../sketchproxy"
command -v wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }
go install golang.org/x/perf/cmd/benchstat@latest
bs="$(go env GOPATH)/bin/benchstat"
mkdir -p bench
go test -run XXX -bench ProxyOverhead -benchtime 2s -count 6 ./cmd/sketchproxy > bench/overhead.txt
"$bs" -col /impl bench/overhead.txt | tee bench/overhead-benchstat.txt
"$bs" -col /impl -filter "/impl:(reverse-proxy OR sketchproxy OR sketchproxy-headers-off)" bench/overhead.txt > bench/overhead-vs-reverseproxy.txt

bin=$(mktemp -d)/sketchproxy
go build -o "$bin" ./cmd/sketchproxy
cfg=$(mktemp --suffix .yaml)
cat > "$cfg" <<'YAML'
listen: 127.0.0.1:18080
admin: "off"
upstream: http://127.0.0.1:18081
rules:
  - name: api
    key: [ip]
    tarpit: true
    limits: [{requests: 1000000000, per: 1s, burst: 8000000}]
YAML
"$bin" -demo-upstream 127.0.0.1:18081 >/dev/null & up=$!
"$bin" -config "$cfg" 2>/dev/null & px=$!
trap 'kill $up $px 2>/dev/null' EXIT
sleep 1
{
  echo "## wrk -t2 -c32 -d10s --latency, upstream alone"
  wrk -t2 -c32 -d10s --latency http://127.0.0.1:18081/
  echo "## the same through sketchproxy"
  wrk -t2 -c32 -d10s --latency http://127.0.0.1:18080/
} | tee bench/wrk.txt
