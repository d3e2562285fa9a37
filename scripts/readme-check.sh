#!/usr/bin/env bash
# Runs the README's short commands exactly as the README writes them, on
# this checkout, and fails if one fails (make test-readme; CI runs it):
# the root README's (and the grpclimit lines of docs/LIMIT.md, which it
# links to), then SketchProxy's README's and its pages'
# (sketchproxy/docs/*.md) that are short enough to run. The long runs the
# READMEs name (make bench, make theory, make sketchproxy-bench, the
# benchmark commands) have their own targets.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
gotmp=$(mktemp -d "$PWD/sketchproxy/.readme-check.XXXXXX") # a package inside SketchProxy's module; ./... skips dot directories
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp" "$gotmp"' EXIT
step() { echo "== $*"; }
# said PAGE LINE: PAGE shows LINE as a line of its own, so that the command
# run next is the page's, as written.
said() { grep -qxF -- "$2" "$1" || { echo "$1 no longer shows the line: $2"; exit 1; }; }

step 'scripts/deps.sh -check, and the README names each package it installs'
bash scripts/deps.sh -check
setup=$(sed -n '/^### Setting up a machine/,/^### /p' README.md)
for pkg in $(sed -n 's/^  [a-z0-9-]*:\([a-z0-9-]*\) .*/\1/p' scripts/deps.sh); do
  grep -q "\`$pkg\`" <<<"$setup" || { echo "README, Setting up a machine, does not name $pkg (scripts/deps.sh installs it)"; exit 1; }
done

step 'the two commands, as Two commands shows them, then go run ./cmd/epochsketch'
said README.md 'go run ./cmd/epochsketch'
said README.md 'make test' # the whole of make test is CI's run, not this check's
go run ./cmd/epochsketch > "$tmp/demo.txt"
grep -q "attacker:10.6.6.6" "$tmp/demo.txt"

step 'go run ./cmd/epochsketch ticks / size -heavy N / top'
go run ./cmd/epochsketch ticks | grep "API rate limiting" >/dev/null
go run ./cmd/epochsketch size -heavy 1000 | grep "buckets         500" >/dev/null
printf 'a\nb\na\n' | go run ./cmd/epochsketch top -k 1 | grep -E '^1 +a +2' >/dev/null
go run ./cmd/epochsketch top -format combined -key ip -k 1 cmd/epochsketch/testdata/nginx-access.log | grep "final after 600 lines (0 empty, 0 malformed" >/dev/null

step 'go install ./cmd/epochsketch'
GOBIN="$tmp/bin" go install ./cmd/epochsketch
"$tmp/bin/epochsketch" help | grep "epochsketch top" >/dev/null
"$tmp/bin/epochsketch" -h | grep "epochsketch simulator" >/dev/null

step 'the library from a clone, with the README'"'"'s replace line'
said README.md 'require github.com/epochsketch/epochsketch v0.0.0'
said README.md 'replace github.com/epochsketch/epochsketch => ../epochsketch'
mkdir -p "$tmp/app"
cat > "$tmp/app/go.mod" <<MOD
module example.com/app

go 1.26

require github.com/epochsketch/epochsketch v0.0.0
replace github.com/epochsketch/epochsketch => $PWD
MOD
cat > "$tmp/app/main.go" <<'GO'
package main

import (
	"fmt"
	"path/filepath"
	"os"
	"time"

	"github.com/epochsketch/epochsketch"
	"github.com/epochsketch/epochsketch/limit"
)

func main() {
	l := limit.New(10, time.Second) // the README's limiter
	defer l.Close()
	admitted := 0
	for i := range 40 { // an idle client's burst is 10 (15 if a tick of 500 ms passes meanwhile)
		if l.Allow("192.0.2.1") {
			admitted++
		} else if i < 10 {
			panic(fmt.Sprint("request ", i+1, " refused"))
		}
	}
	if admitted > 15 {
		panic(fmt.Sprint(admitted, " of 40 admitted"))
	}
	sk := epochsketch.New(epochsketch.Config{NumBuckets: 1 << 16, TickDuration: time.Second})
	defer sk.Close()
	sk.Observe("api_client:192.168.1.50")
	path := filepath.Join(os.TempDir(), fmt.Sprintf("readme-check-%d.snap", os.Getpid()))
	defer os.Remove(path)
	if err := sk.SaveFile(path); err != nil {
		panic(err)
	}
	info, err := sk.LoadFile(path)
	if err != nil || info.Live != 1 {
		panic(fmt.Sprint(info, err))
	}
	fmt.Println("ok")
}
GO
(cd "$tmp/app" && go run .) | grep ok >/dev/null

step 'limit/grpclimit from a clone, with the require and replace lines of docs/LIMIT.md'
mkdir -p "$tmp/grpcapp"
lines=$(sed -n '/^require (/,/^)/p;/^replace (/,/^)/p' docs/LIMIT.md | sed "s#=> \.\./epochsketch#=> $PWD#")
grep -q "limit/grpclimit => $PWD/limit/grpclimit" <<<"$lines" || { echo "docs/LIMIT.md: no replace line for limit/grpclimit"; exit 1; }
printf 'module example.com/grpcapp\n\ngo 1.26\n\n%s\n' "$lines" > "$tmp/grpcapp/go.mod"
cat > "$tmp/grpcapp/main.go" <<'GO'
package main

import (
	"fmt"
	"time"

	"github.com/epochsketch/epochsketch/limit"
	"github.com/epochsketch/epochsketch/limit/grpclimit"
)

func main() {
	fmt.Println(grpclimit.New(limit.New(100, time.Second), grpclimit.PeerIP) != nil)
}
GO
(cd "$tmp/grpcapp" && go mod tidy >/dev/null 2>&1 && go run .) | grep true >/dev/null

step 'cd sketchproxy && go run ./cmd/sketchproxy, and the curl loop it prints'
(cd sketchproxy && go build -o "$tmp/sketchproxy" ./cmd/sketchproxy)
"$tmp/sketchproxy" -listen 127.0.0.1:0 -admin 127.0.0.1:0 > "$tmp/proxy.out" 2>&1 &
for _ in $(seq 100); do grep -q "curl -s" "$tmp/proxy.out" && break; sleep 0.1; done
loop=$(grep -o "for i in .*echo" "$tmp/proxy.out")
codes=$(bash -c "$loop")
echo "$codes"
case "$codes" in *"200 200 200"*429*) ;; *) echo "the demo loop answered: $codes"; exit 1 ;; esac

pages=(sketchproxy/README.md sketchproxy/docs/*.md)
sp_readme=sketchproxy/README.md

# away_from_tick_edge SECONDS: waits until a burst sent now ends before the
# next tick of that length (counts halve at tick edges, which are Unix
# time's multiples of the tick).
away_from_tick_edge() {
  local t=$(( $1 * 1000 )) ms
  while :; do
    ms=$(( $(date +%s%3N) % t ))
    (( ms > 200 && ms < t - 1500 )) && return
    sleep 0.1
  done
}

# burst URL: the page's loop of seven requests, sent to URL.
loop=$(tr -s '\n ' ' ' < sketchproxy/docs/forward-auth.md | grep -o "for i in \$(seq 1 7); do curl -s -o /dev/null -w '%{http_code} ' URL; done" | sed -n 1p)
[ -n "$loop" ] || { echo "sketchproxy/docs/forward-auth.md no longer shows the burst of seven"; exit 1; }
burst() { away_from_tick_edge 5; bash -c "${loop//URL/$1}"; }
want_burst=$(tr -s '\n ' ' ' < sketchproxy/docs/forward-auth.md | grep -o '`200 200 200 200 200 429 429`' | sed -n 1p | tr -d '`')
[ -n "$want_burst" ] || { echo "sketchproxy/docs/forward-auth.md no longer says what the burst shows"; exit 1; }

# wait_line FILE REGEX: the first match of REGEX in FILE, within 60 s.
wait_line() {
  for _ in $(seq 600); do
    grep -oE -m1 "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "timed out waiting for /$2/ in $1:"; cat "$1"; exit 1
}

step 'SketchProxy: go install ./cmd/sketchproxy, -example minimal, -check'
(cd sketchproxy && GOBIN="$tmp/bin" go install ./cmd/sketchproxy)
export PATH="$tmp/bin:$PATH" # the pages say sketchproxy
said "$sp_readme" 'sketchproxy -example minimal > proxy.yaml'
said "$sp_readme" 'sketchproxy -config proxy.yaml -check'
(cd "$tmp" && sketchproxy -example minimal > proxy.yaml && sketchproxy -config proxy.yaml -check) | grep '^proxy.yaml: ok, 1 rule$' >/dev/null
sketchproxy -example > "$tmp/tour.yaml"
sketchproxy -config "$tmp/tour.yaml" -check 2>/dev/null | grep 'tour.yaml: ok, ' >/dev/null

step 'SketchProxy: -check on every example config, and every -check line of the pages'
for f in sketchproxy/examples/*/sketchproxy.yaml; do
  case $f in */kubernetes/*) continue ;; esac # a Kubernetes manifest, whose ConfigMap holds the config (TestKubernetesExample)
  sketchproxy -config "$f" -check >/dev/null
done
grep -hxE 'sketchproxy -config sketchproxy/examples/[a-z-]+/sketchproxy\.yaml -check' "${pages[@]}" | sort -u | while read -r line; do
  $line >/dev/null
done
envoy_said=$(tr -s '\n ' ' ' < sketchproxy/docs/envoy.md | grep -o 'ok, 0 rules, envoy_rls: [^`]*' | sed -n 1p)
envoy_got=$(sketchproxy -config sketchproxy/examples/envoy/sketchproxy.yaml -check)
[ "$envoy_got" = "sketchproxy/examples/envoy/sketchproxy.yaml: $envoy_said" ] || { echo "envoy -check printed: $envoy_got; docs/envoy.md says: $envoy_said"; exit 1; }

step 'SketchProxy: a fleet section as its README writes it checks'
sed -n '/^### A fleet through Redis/,/^## /p' "$sp_readme" | sed -n '/^```yaml$/,/^```$/p' | sed '1d;$d' \
  | sed "s#/etc/sketchproxy/fleet-secret#$tmp/fleet-secret#" > "$tmp/fleet.yaml"
grep -q '^fleet:' "$tmp/fleet.yaml" || { echo "$sp_readme: no fleet section in A fleet through Redis"; exit 1; }
openssl rand -hex 32 > "$tmp/fleet-secret"
cat "$tmp/proxy.yaml" "$tmp/fleet.yaml" > "$tmp/fleet-proxy.yaml"
sketchproxy -config "$tmp/fleet-proxy.yaml" -check | grep ': ok, 1 rule$' >/dev/null

step 'SketchProxy: -key-label and the openssl line of docs/metrics.md, with its example secret'
secret=$(tr -s '\n ' ' ' < sketchproxy/docs/metrics.md | grep -o 'is for the secret `[0-9a-f]*`' | tr -d '`' | awk '{print $NF}')
said_label=$(grep -oE '^# k:[0-9a-f]{12} 203\.0\.113\.7 ' sketchproxy/docs/metrics.md | awk '{print $2, $3}')
[ -n "$secret" ] && [ -n "$said_label" ] || { echo "sketchproxy/docs/metrics.md no longer gives its example secret and label"; exit 1; }
said sketchproxy/docs/metrics.md 'sketchproxy -config /etc/sketchproxy/proxy.yaml -key-label 203.0.113.7'
printf '%s\n' "$secret" > "$tmp/label.key"
printf 'upstream: "http://127.0.0.1:9000"\nkey_label_secret_file: %s\nrules:\n  - limits: [{requests: 1, per: 1s}]\n' "$tmp/label.key" > "$tmp/label.yaml"
got_label=$(sketchproxy -config "$tmp/label.yaml" -key-label 203.0.113.7)
[ "$got_label" = "$said_label" ] || { echo "-key-label printed $got_label; docs/metrics.md says $said_label"; exit 1; }
said sketchproxy/docs/metrics.md "printf '%s' 203.0.113.7 | openssl dgst -sha256 -hmac \"\$(cat /etc/sketchproxy/label.key)\""
sum=$(printf '%s' 203.0.113.7 | openssl dgst -sha256 -hmac "$(cat "$tmp/label.key")" | awk '{print $NF}')
[ "k:${sum:0:12}" = "${said_label% *}" ] || { echo "openssl gave k:${sum:0:12}; docs/metrics.md says ${said_label% *}"; exit 1; }

step 'SketchProxy: the Go middleware and sketchproxy.Limiter snippets of its README'
awk '/^```go$/ {n++; in_go=1; next} in_go && /^```$/ {in_go=0; print "// end " n; next} in_go' "$sp_readme" > "$tmp/go-blocks.txt"
sed -n '1,/^\/\/ end 1$/p' "$tmp/go-blocks.txt" | sed '$d' > "$gotmp/main.go"
mkdir "$gotmp/limiter"
{
  printf 'package main\n\nimport (\n\t"log"\n\t"time"\n\n\t"github.com/epochsketch/epochsketch/sketchproxy"\n)\n\nfunc main() {\n'
  sed -n '/^\/\/ end 1$/,/^\/\/ end 2$/p' "$tmp/go-blocks.txt" | sed '1d;$d' | sed 's/^/\t/'
  printf '}\n'
} > "$gotmp/limiter/main.go"
grep -q 'sketchproxy.New(cfg, app' "$gotmp/main.go" && grep -q 'sketchproxy.NewLimiter' "$gotmp/limiter/main.go" \
  || { echo "$sp_readme: the middleware and Limiter snippets moved"; exit 1; }
(cd sketchproxy && go vet "./$(basename "$gotmp")" "./$(basename "$gotmp")/limiter" && go run "./$(basename "$gotmp")/limiter")

step 'SketchProxy: the nginx and Caddy forward-auth examples, and the burst of docs/forward-auth.md'
for gw in nginx caddy; do
  said "$sp_readme" "sketchproxy/examples/$gw/run.sh"
  said "sketchproxy/docs/forward-auth.md" "sketchproxy/examples/$gw/run.sh"
  "sketchproxy/examples/$gw/run.sh" > "$tmp/$gw.out" 2>&1 &
  pid=$!
  url=$(wait_line "$tmp/$gw.out" 'http://127\.0\.0\.1:[0-9]+/')
  codes=$(burst "$url")
  other=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Forwarded-For: 203.0.113.5' "$url")
  kill -TERM "$pid"; wait "$pid" || true
  echo "$gw: $codes, another client $other"
  [ "$codes" = "$want_burst " ] && [ "$other" = 200 ] || { echo "$gw: the burst answered '$codes' and another client $other; the page says $want_burst, and 200"; exit 1; }
done

step "SketchProxy: Envoy's rate-limit service and the replay, as its README and docs/envoy.md write them"
for line in 'go run ./cmd/sketchproxy -config examples/envoy/sketchproxy.yaml &' 'go run ./examples/envoy/replay -n 6 -client 203.0.113.1'; do
  said "$sp_readme" "$line"; said sketchproxy/docs/envoy.md "$line"
done
said sketchproxy/docs/envoy.md "go run ./examples/envoy/replay -n 11 -path /v1/generate -H 'X-API-Key: k1'"
# The example listens on 127.0.0.1:8081, as Envoy's config names it; a
# check never takes a fixed port, so it runs a copy on a free one and
# points the replay at it (-rls): the same config and commands otherwise.
mkdir -p "$tmp/envoy-example"
cp -r sketchproxy/examples/envoy/ratelimit "$tmp/envoy-example/"
sed 's#listen: "127.0.0.1:8081"#listen: "127.0.0.1:0"#' sketchproxy/examples/envoy/sketchproxy.yaml > "$tmp/envoy-example/sketchproxy.yaml"
grep -q 'listen: "127.0.0.1:0"' "$tmp/envoy-example/sketchproxy.yaml" || { echo "examples/envoy/sketchproxy.yaml no longer listens on 127.0.0.1:8081"; exit 1; }
sketchproxy -config "$tmp/envoy-example/sketchproxy.yaml" -admin off > "$tmp/envoy.out" 2>&1 &
pid=$!
rls=$(wait_line "$tmp/envoy.out" 'envoy rate limit service listening.*addr=127\.0\.0\.1:[0-9]+' | grep -oE 'addr=127\.0\.0\.1:[0-9]+' | cut -d= -f2)
away_from_tick_edge 30
first=$(cd sketchproxy && go run ./examples/envoy/replay -rls "$rls" -n 6 -client 203.0.113.1 | grep -oE '(OK|OVER_LIMIT): Envoy [a-z]+' | tr '\n' ' ')
second=$(cd sketchproxy && go run ./examples/envoy/replay -rls "$rls" -n 11 -path /v1/generate -H 'X-API-Key: k1' | grep -oE '(OK|OVER_LIMIT): Envoy [a-z]+' | tr '\n' ' ')
kill -TERM "$pid"; wait "$pid" || true
[ "$first" = "$(printf 'OK: Envoy forwards %.0s' 1 2 3 4 5)OVER_LIMIT: Envoy answers " ] || { echo "replay -n 6: $first"; exit 1; }
[ "$second" = "$(printf 'OK: Envoy forwards %.0s' $(seq 10))OVER_LIMIT: Envoy answers " ] || { echo "replay -n 11 -path /v1/generate: $second"; exit 1; }

step 'SketchProxy: the Caddy module built, its README Caddyfile adapted, and examples/caddy-module/run.sh'
said "$sp_readme" 'cd sketchproxy/caddy && go build -o caddy ./cmd/caddy'
(cd sketchproxy/caddy && go build -o "$tmp/caddy" ./cmd/caddy)
"$tmp/caddy" list-modules | grep -x 'http.handlers.epochsketch' >/dev/null
"$tmp/caddy" list-modules | grep -x 'http.matchers.epochsketch_path' >/dev/null
sed -n '/^### Inside Caddy/,/^### /p' "$sp_readme" | sed -n '/^```caddyfile$/,/^```$/p' | sed '1d;$d' > "$tmp/Caddyfile"
grep -q epochsketch "$tmp/Caddyfile" || { echo "$sp_readme: no Caddyfile in Inside Caddy"; exit 1; }
HOME=$tmp XDG_DATA_HOME=$tmp XDG_CONFIG_HOME=$tmp "$tmp/caddy" adapt --config "$tmp/Caddyfile" --adapter caddyfile > /dev/null
said "$sp_readme" '`sketchproxy/examples/caddy-module/run.sh` builds that Caddy and runs it'
EPOCHSKETCH_CADDY="$tmp/caddy" sketchproxy/examples/caddy-module/run.sh > "$tmp/module.out" 2>&1 &
pid=$!
url=$(wait_line "$tmp/module.out" 'http://127\.0\.0\.1:[0-9]+/')
codes=$(burst "$url")
kill -TERM "$pid"; wait "$pid" || true
echo "caddy module: $codes"
[ "$codes" = "$want_burst " ] || { echo "the Caddy module's burst answered '$codes', the README says $want_burst"; exit 1; }

echo "readme-check: every short README command ran as written"
