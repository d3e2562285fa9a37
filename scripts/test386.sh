#!/usr/bin/env bash
# The library's tests on GOARCH=386 (make test-core): 32-bit words, the
# atomic alignment and the count arithmetic of docs/DESIGN.md. A host whose
# kernel cannot run 32-bit binaries (no IA32 emulation: "exec format
# error") cannot run them: there this says so and skips, unless CI is set,
# when it fails (CI's host runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'package main\nfunc main() {}\n' > "$tmp/main.go"
(cd "$tmp" && GOARCH=386 GOFLAGS=-mod=mod "$GO" build -o probe main.go 2>/dev/null)
if ! "$tmp/probe" 2>/dev/null; then
  if [ -n "${CI:-}" ]; then
    echo "test386: this host cannot run 32-bit binaries, and CI must run the 386 tests" >&2
    exit 1
  fi
  echo "test386: SKIPPED: this host's kernel cannot run 32-bit binaries (exec format error); CI runs them"
  exit 0
fi
GOARCH=386 "$GO" test ${SHORT:-} .
