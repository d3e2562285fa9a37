#!/usr/bin/env bash
# Caddy built with the epochsketch module (sketchproxy/caddy, as xcaddy
# would build it) in front of a demo app. Everything runs on free loopback
# ports until interrupted; nothing is left behind.
#
#   sketchproxy/examples/caddy-module/run.sh
#
# Then, in another terminal (the URL is the one printed):
#   for i in $(seq 1 7); do curl -s -o /dev/null -w '%{http_code} ' URL; done; echo
# shows five 200s, then 429 with Retry-After and RateLimit (curl -i).
# The first build of Caddy downloads and compiles its modules (minutes);
# EPOCHSKETCH_CADDY=/path/to/caddy runs a binary already built with the
# module instead (the tests do).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
start_demo_upstream
caddy=${EPOCHSKETCH_CADDY:-}
if [ -z "$caddy" ]; then
  caddy=$tmp/caddy
  (cd "$repo/sketchproxy/caddy" && go build -o "$caddy" ./cmd/caddy)
fi
write_conf() {
  sed -e "s|@PORT@|$port|g" -e "s|@APP@|$upstream|g" "$here/Caddyfile" > "$tmp/Caddyfile"
}
# Caddy keeps its state under HOME and XDG directories: point them at tmp.
HOME=$tmp XDG_DATA_HOME=$tmp XDG_CONFIG_HOME=$tmp \
  start_on_free_port caddy write_conf "$caddy" run --config "$tmp/Caddyfile" --adapter caddyfile
serve "http://127.0.0.1:$port/"
