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
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../lib.sh"
nginx=$(need nginx nginx)
start_sketchproxy "$here/sketchproxy.yaml"
port=$(free_port)
mkdir -p "$tmp/body" "$tmp/proxy" "$tmp/fastcgi" "$tmp/uwsgi" "$tmp/scgi"
sed -e "s|@TMP@|$tmp|g" -e "s|@PORT@|$port|g" -e "s|@APP@|$upstream|g" -e "s|@CHECK@|$check|g" \
  "$here/nginx.conf" > "$tmp/nginx.conf"
"$nginx" -q -p "$tmp" -c "$tmp/nginx.conf" -g 'daemon off;' > "$tmp/nginx.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  (: < "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "${pids[-1]}" 2>/dev/null || { cat "$tmp"/nginx*.log >&2; die "nginx did not start"; }
  sleep 0.1
done
serve "http://127.0.0.1:$port/"
