#!/usr/bin/env bash
# Compares the machine code of the package's functions between a git revision
# and the working tree: instructions per function, ignoring position-only
# NOPs and inline marks. Used to show that the simulator's trace hooks
# (traceOn = false) compile to nothing: scripts/asmdiff.sh <rev>.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:?usage: scripts/asmdiff.sh REV}
tmp=$(mktemp -d); trap 'git worktree remove --force "$tmp/base" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
git worktree add -f "$tmp/base" "$rev" >/dev/null 2>&1
count() {
  (cd "$1" && go build -a -gcflags=-S . 2>&1) | awk -F'\t' '
    / STEXT/ { split($0, a, " "); name = a[1]; next }
    NF >= 3 && $3 ~ /^[A-Z]/ && $3 !~ /^(NOP|PCDATA|FUNCDATA|TEXT)$/ && !($3 == "XCHGL" && $4 == "AX, AX") {
      op = $3 "\t" $4; gsub(/[0-9]+$/, "", op); n[name]++; h[name] = h[name] op "|" }
    END { for (k in n) print k, n[k], length(h[k]) }' | sort
}
count "$tmp/base" > "$tmp/old"; count . > "$tmp/new"
join -a1 -a2 -e- -o 0,1.2,2.2,1.3,2.3 "$tmp/old" "$tmp/new" |
  awk '{ d = ($2 != $3 || $4 != $5) } d { print "differs:", $1, "instructions", $2, "->", $3; bad++ }
       END { if (!bad) print "identical: every function has the same instructions"; exit bad > 0 }'
