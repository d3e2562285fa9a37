#!/usr/bin/env bash
# Runs the README's short commands exactly as the README writes them, on
# this checkout, and fails if one fails (make test-readme; CI runs it).
# The long runs the README names (make bench, make theory, make
# sketchproxy-bench, the benchmark commands) have their own targets.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
step() { echo "== $*"; }

step 'scripts/deps.sh -check, and the README names each package it installs'
bash scripts/deps.sh -check
setup=$(sed -n '/^### Setting up a machine/,/^### /p' README.md)
for pkg in $(sed -n 's/^  [a-z0-9-]*:\([a-z0-9-]*\) .*/\1/p' scripts/deps.sh); do
  grep -q "\`$pkg\`" <<<"$setup" || { echo "README, Setting up a machine, does not name $pkg (scripts/deps.sh installs it)"; exit 1; }
done

step 'go run ./cmd/epochsketch'
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

step 'limit/grpclimit from a clone, with the README'"'"'s require and replace lines'
mkdir -p "$tmp/grpcapp"
lines=$(sed -n '/^require (/,/^)/p;/^replace (/,/^)/p' README.md | sed "s#=> \.\./epochsketch#=> $PWD#")
grep -q "limit/grpclimit => $PWD/limit/grpclimit" <<<"$lines" || { echo "README: no replace line for limit/grpclimit"; exit 1; }
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

echo "readme-check: every short README command ran as written"
