#!/usr/bin/env bash
# Regenerates cmd/epochsketch/testdata/nginx-access.log: Debian's nginx on
# loopback (port 18080) logging in Combined Log Format, driven by curl from
# distinct loopback source addresses: 127.0.0.2 makes 300 requests,
# 127.0.0.3 makes 200, and 127.0.0.10..29 make 5 each.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nginx >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nginx-light >/dev/null; }
d=$(mktemp -d)
mkdir -p "$d/logs"
cat > "$d/nginx.conf" <<CONF
worker_processes 1;
pid $d/nginx.pid;
error_log $d/logs/error.log;
events { worker_connections 256; }
http {
  access_log $d/logs/access.log combined;
  client_body_temp_path $d/body; proxy_temp_path $d/proxy; fastcgi_temp_path $d/fcgi; uwsgi_temp_path $d/uwsgi; scgi_temp_path $d/scgi;
  server { listen 127.0.0.1:18080; location / { return 200 "ok\n"; } }
}
CONF
nginx -c "$d/nginx.conf"
trap 'nginx -c "$d/nginx.conf" -s stop' EXIT
sleep 0.5
for i in $(seq 1 300); do curl -s -o /dev/null --interface 127.0.0.2 -A "heavy-client/1.0" "http://127.0.0.1:18080/api/items?i=$i"; done
for i in $(seq 1 200); do curl -s -o /dev/null --interface 127.0.0.3 -A "second-client/1.0" -X POST "http://127.0.0.1:18080/api/login"; done
for c in $(seq 10 29); do for i in 1 2 3 4 5; do curl -s -o /dev/null --interface "127.0.0.$c" "http://127.0.0.1:18080/page/$i"; done; done
sleep 0.5
cp "$d/logs/access.log" cmd/epochsketch/testdata/nginx-access.log
wc -l cmd/epochsketch/testdata/nginx-access.log
