#!/usr/bin/env bash
# SketchProxy's envoy_rls beside envoyproxy/ratelimit (BENCHMARKS.md, "Beside
# envoyproxy/ratelimit"; make rls-compare). Builds both (envoyproxy/ratelimit
# once, with go install from the module proxy, into a cache outside the
# tree), starts redis-server and the services on free loopback ports with
# the same domain file (sketchproxy/examples/envoy/ratelimit/api.yaml), and
# runs the same load from one client (sketchproxy/cmd/rlsload) against each:
# a hot value, then VALUES distinct ones, DURATION each at CONCURRENCY calls
# in flight. envoyproxy/ratelimit runs twice, as it ships and with the
# settings its README recommends for throughput, each on its own
# redis-server so Redis memory is its own. Records each process's RSS
# (/proc) and Redis's used_memory and key count before and after each run,
# and the calls each allowed per second (the domain file allows 100 per
# second per value: both should allow about that on the hot value); writes a
# markdown table to stdout and to OUT.
#
#   make rls-compare
#   DURATION=5s CONCURRENCY=32 bash scripts/rls-compare.sh
set -euo pipefail
source "$(dirname "$0")/../sketchproxy/examples/lib.sh"

RLS_VERSION=${RLS_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-16}
VALUES=${VALUES:-100000}
OUT=${OUT:-$repo/sketchproxy/bench/rls-compare.txt}
tuned_env=(REDIS_PIPELINE_WINDOW=150us LOCAL_CACHE_SIZE_IN_BYTES=8388608)

command -v go >/dev/null 2>&1 || die "go is not installed (https://go.dev/dl/)"
redis_server=$(need redis-server redis-server)
redis_cli=$(need redis-cli redis-tools)

# envoyproxy/ratelimit, built once per version.
cache=${RLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/epochsketch/ratelimit-$RLS_VERSION}
rl_bin=$cache/service_cmd
if [ ! -x "$rl_bin" ]; then
  echo "building envoyproxy/ratelimit $RLS_VERSION into $cache (once)" >&2
  (cd "$tmp" && GOBIN=$cache GOFLAGS= go install "github.com/envoyproxy/ratelimit/src/service_cmd@$RLS_VERSION") ||
    die "go install github.com/envoyproxy/ratelimit/src/service_cmd@$RLS_VERSION failed (it needs the Go module proxy)"
fi
(cd "$repo/sketchproxy" && go build -o "$tmp/sketchproxy" ./cmd/sketchproxy && go build -o "$tmp/rlsload" ./cmd/rlsload)

domain_file=$repo/sketchproxy/examples/envoy/ratelimit/api.yaml
mem_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
redis_bytes() { "$redis_cli" -h 127.0.0.1 -p "$1" info memory | tr -d '\r' | awk -F: '$1 == "used_memory" {print $2}'; }

# start_redis: a redis-server with nothing saved, on a free port ($port).
no_config() { :; }
run_redis() { exec "$redis_server" --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$tmp"; }

# start_ratelimit NAME ENV...: envoyproxy/ratelimit on its own redis-server,
# every listener on a free loopback port; sets NAME's pid, gRPC address and
# Redis port.
rl_ports() { rl_http=$(free_port) rl_debug=$(free_port); }
run_ratelimit() {
  exec env USE_STATSD=false LOG_LEVEL=warn LIMIT_RESPONSE_HEADERS_ENABLED=true \
    REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" \
    RUNTIME_ROOT="$tmp/runtime-$rl_name" RUNTIME_SUBDIRECTORY=ratelimit \
    HOST=127.0.0.1 PORT="$rl_http" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$rl_debug" \
    GRPC_HOST=127.0.0.1 GRPC_PORT="$port" "${rl_env[@]}" "$rl_bin"
}
declare -A pid addr rport
start_ratelimit() {
  rl_name=$1 rl_env=("${@:2}")
  start_on_free_port "redis-$rl_name" no_config run_redis
  redis_port=$port rport[$rl_name]=$port
  mkdir -p "$tmp/runtime-$rl_name/ratelimit/config"
  cp "$domain_file" "$tmp/runtime-$rl_name/ratelimit/config/"
  start_on_free_port "$rl_name" rl_ports run_ratelimit
  pid[$rl_name]=${pids[-1]} addr[$rl_name]=127.0.0.1:$port
}

cat > "$tmp/sketchproxy.yaml" <<YAML
admin: "off"
envoy_rls:
  listen: "127.0.0.1:0"
  files: ["$domain_file"]
YAML
"$tmp/sketchproxy" -config "$tmp/sketchproxy.yaml" > "$tmp/sketchproxy.log" 2>&1 &
pids+=($!) pid[sketchproxy]=$!
addr[sketchproxy]=$(wait_for "$tmp/sketchproxy.log" 'msg="envoy rate limit service listening" protocol=grpc addr=([0-9.:]+)')
start_ratelimit ratelimit
start_ratelimit ratelimit-tuned "${tuned_env[@]}"

services=(sketchproxy ratelimit ratelimit-tuned)
declare -A label=(
  [sketchproxy]="SketchProxy (envoy_rls)"
  [ratelimit]="envoyproxy/ratelimit"
  [ratelimit-tuned]="envoyproxy/ratelimit, ${tuned_env[*]}"
)
declare -A rss red
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
measure() { # NAME: its RSS, and its Redis's used_memory, now
  rss[$1]=$(mib $(($(mem_kib "${pid[$1]}") * 1024)))
  red[$1]=-
  [ -n "${rport[$1]:-}" ] && red[$1]="$(mib "$(redis_bytes "${rport[$1]}")") ($("$redis_cli" -h 127.0.0.1 -p "${rport[$1]}" dbsize))"
  return 0
}
for s in "${services[@]}"; do
  # The load's readiness call, outside the timed run: each service has read
  # the domain file before its memory is first measured.
  "$tmp/rlsload" -addr "${addr[$s]}" -duration 0 || die "$s did not answer (its log: $tmp/$s.log)"
  measure "$s"
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
rows=()
for values in 1 "$VALUES"; do
  what="hot value"
  [ "$values" -gt 1 ] && what="$values values"
  for s in "${services[@]}"; do
    before_rss=${rss[$s]} before_red=${red[$s]}
    line=$("$tmp/rlsload" -addr "${addr[$s]}" -values "$values" -duration "$DURATION" -concurrency "$CONCURRENCY") ||
      die "the load against $s failed (its log: $tmp/$s.log)"
    measure "$s"
    declare -A r=()
    for kv in $line; do r[${kv%%=*}]=${kv#*=}; done
    rows+=("| ${label[$s]} | $what | ${r[calls_per_s]} | ${r[p50_us]} | ${r[p99_us]} | ${r[ok_per_s]} | ${r[errors]} | $before_rss → ${rss[$s]} | $before_red → ${red[$s]} | $(cut -d' ' -f1 /proc/loadavg) |")
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

{
  echo "# make rls-compare: DURATION=$DURATION CONCURRENCY=$CONCURRENCY VALUES=$VALUES"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- 2>/dev/null || echo ' (with local changes)')"
  echo "# cpu: $(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) cores; $(go version | cut -d' ' -f3-)"
  echo "# envoyproxy/ratelimit $RLS_VERSION; $("$redis_server" --version | cut -d' ' -f1-3)"
  echo "# load average (1, 5, 15 min) $load_before before, $load_after after; the client and every service share these cores"
  echo
  echo "| service | load | calls/s | p50 µs | p99 µs | allowed/s | errors | RSS MiB before → after | Redis used_memory MiB (keys) before → after | load avg at end |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} > "$tmp/table.md"
mkdir -p "$(dirname "$OUT")"
cp "$tmp/table.md" "$OUT"
cat "$tmp/table.md"
