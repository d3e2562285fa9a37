#!/usr/bin/env bash
# Caddy (Debian's package) in front of a demo app, asking SketchProxy
# before each request through forward_auth. Everything runs on free
# loopback ports until interrupted; nothing is left behind.
#
#   sketchproxy/examples/caddy/run.sh
#
# Then, in another terminal (the URL is the one printed):
#   for i in $(seq 1 7); do curl -s -o /dev/null -w '%{http_code} ' URL; done; echo
# shows five 200s, then 429 with Retry-After and RateLimit (curl -i).
# SKETCHPROXY_CONFIG=your.yaml runs your own rules instead of the
# example's (keep its client_ip and forward_auth sections).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
caddy=$(need caddy caddy)
start_sketchproxy "${SKETCHPROXY_CONFIG:-$here/sketchproxy.yaml}"
write_conf() {
  sed -e "s|@PORT@|$port|g" -e "s|@APP@|$upstream|g" -e "s|@CHECK@|$check|g" \
    "$here/Caddyfile" > "$tmp/Caddyfile"
}
# Caddy keeps its state under HOME and XDG directories: point them at tmp.
HOME=$tmp XDG_DATA_HOME=$tmp XDG_CONFIG_HOME=$tmp \
  start_on_free_port caddy write_conf "$caddy" run --config "$tmp/Caddyfile" --adapter caddyfile
serve "http://127.0.0.1:$port/"
