# Shared by the gateway examples' run.sh: build sketchproxy, start the demo
# upstream and sketchproxy on free loopback ports, and stop everything at
# exit. Everything written goes to one temporary directory, removed at exit.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sketchproxy-example.XXXXXX")
pids=()

cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

# need NAME PACKAGE: the path of NAME (also looked for in /usr/sbin), or exit.
need() {
  local p
  p=$(command -v "$1" 2>/dev/null || true)
  [ -z "$p" ] && [ -x "/usr/sbin/$1" ] && p=/usr/sbin/$1
  [ -n "$p" ] || die "$1 is not installed (Debian: apt-get install $2)"
  echo "$p"
}

# wait_for FILE REGEX: the first match of the extended REGEX's group 1 in
# FILE, within 60 s (a first build takes a while).
wait_for() {
  local i text
  for i in $(seq 1 600); do
    text=$(cat "$1" 2>/dev/null || true)
    if [[ $text =~ $2 ]]; then echo "${BASH_REMATCH[1]}"; return 0; fi
    sleep 0.1
  done
  echo "--- $1:" >&2; cat "$1" >&2
  die "timed out waiting for /$2/ in $1"
}

# free_port: a loopback port below the kernel's ephemeral range (where
# outgoing connections take their local ports) that nothing answers on now.
free_port() {
  local p low=32768
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r low _ < /proc/sys/net/ipv4/ip_local_port_range
  while :; do
    p=$((10000 + RANDOM % (low - 10000)))
    if ! (: < "/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}

# start_on_free_port NAME WRITE CMD...: picks a free port into $port, calls
# WRITE (which writes the server's config for it) and starts CMD, until the
# server answers on the port; another process can take a port between the
# check and the bind, so up to 5 tries, each on a new port.
start_on_free_port() {
  local name=$1 write=$2 try pid
  shift 2
  for try in 1 2 3 4 5; do
    port=$(free_port)
    "$write"
    "$@" > "$tmp/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do
      if (: < "/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        pids+=("$pid")
        return 0
      fi
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  cat "$tmp/$name.log" >&2
  die "$name did not start"
}

# start_demo_upstream: builds sketchproxy and starts its demo upstream on a
# free port; sets upstream (host:port).
start_demo_upstream() {
  command -v go >/dev/null || die "go is not installed"
  (cd "$repo/sketchproxy" && go build -o "$tmp/sketchproxy" ./cmd/sketchproxy)
  "$tmp/sketchproxy" -demo-upstream 127.0.0.1:0 > "$tmp/upstream.log" 2>&1 &
  pids+=($!)
  upstream=$(wait_for "$tmp/upstream.log" 'demo upstream on http://([0-9.:]+)/')
}

# start_sketchproxy CONFIG: builds sketchproxy, starts the demo upstream and
# sketchproxy with CONFIG on free ports; sets upstream (host:port) and check
# (host:port of the forward-auth endpoint).
start_sketchproxy() {
  start_demo_upstream
  "$tmp/sketchproxy" -config "$1" -listen 127.0.0.1:0 -admin off > "$tmp/sketchproxy.log" 2>&1 &
  pids+=($!)
  check=$(wait_for "$tmp/sketchproxy.log" 'msg="forward_auth listening" addr=([0-9.:]+)')
}

# serve URL: says where to go, then runs until interrupted or until a
# process it started exits.
serve() {
  echo "open $1"
  wait -n "${pids[@]}" || true
  tail -n 20 "$tmp"/*.log >&2 || true
  die "a process it started stopped (its log is above)"
}
