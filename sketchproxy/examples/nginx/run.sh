#!/usr/bin/env bash
# nginx (Debian's package) in front of a demo app, asking SketchProxy
# before each request through auth_request. Everything runs on free
# loopback ports until interrupted; nothing is left behind.
#
#   sketchproxy/examples/nginx/run.sh
#
# Then, in another terminal (the URL is the one printed):
#   for i in $(seq 1 7); do curl -s -o /dev/null -w '%{http_code} ' URL; done; echo
# shows five 200s, then 429 with Retry-After and RateLimit (curl -i).
# SKETCHPROXY_CONFIG=your.yaml runs your own rules instead of the
# example's (keep its client_ip and forward_auth sections).
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
nginx=$(need nginx nginx)
start_sketchproxy "${SKETCHPROXY_CONFIG:-$here/sketchproxy.yaml}"
mkdir -p "$tmp/body" "$tmp/proxy" "$tmp/fastcgi" "$tmp/uwsgi" "$tmp/scgi"
write_conf() {
  sed -e "s|@TMP@|$tmp|g" -e "s|@PORT@|$port|g" -e "s|@APP@|$upstream|g" -e "s|@CHECK@|$check|g" \
    "$here/nginx.conf" > "$tmp/nginx.conf"
}
start_on_free_port nginx write_conf "$nginx" -q -p "$tmp" -c "$tmp/nginx.conf" -g 'daemon off;'
serve "http://127.0.0.1:$port/"
