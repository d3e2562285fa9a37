#!/usr/bin/env bash
# Everything a new machine needs for `make test` beside Go, in one list:
# the README ("Setting up a machine") tells you to run this script, and
# .ci/run runs it before `make test`.
#
#   scripts/deps.sh          install what is missing (Debian or Ubuntu; uses
#                            sudo when not root)
#   scripts/deps.sh -check   say what is missing; exit 1 if anything is
set -euo pipefail
cd "$(dirname "$0")/.."

# command:package, and the test that needs it.
deps=(
  gcc:gcc                    # go test -race needs cgo
  make:make                  # make test itself
  bible:bible-kjv            # the King James tests
  chromium:chromium          # the simulator's browser test (simulator/e2e)
  redis-server:redis-server  # SketchProxy's fleet test starts its own on a free port
  python3:python3            # SketchProxy's WSGI upstream test
  curl:curl                  # the README's demo loop (make test-readme)
  openssl:openssl            # SketchProxy's key-label and secret commands (make test-readme)
  nginx:nginx                # SketchProxy's gateway examples, end to end
  caddy:caddy                # the same, for Caddy
  qemu-i386:qemu-user        # the 386 tests on a kernel without 32-bit support (scripts/test386.sh)
)

missing=()
for d in "${deps[@]}"; do
  cmd=${d%%:*}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("${d#*:}")
done

# Go: the version the modules' go.mod files need, and the one the committed
# WebAssembly was built with (simulator/GOVERSION: TestWasmUpToDate compares
# the bytes, and fails under CI with another Go).
want=$(cat simulator/GOVERSION)
if ! command -v go >/dev/null 2>&1; then
  echo "deps: Go is missing: install $want from https://go.dev/dl/ (the tests need Go 1.26 or later)" >&2
  exit 1
fi
have=$(go env GOVERSION)
if [ "$have" != "$want" ]; then
  echo "deps: this is $have; the committed simulator was built with $want, so TestWasmUpToDate skips (and fails under CI)" >&2
fi

if [ "${1:-}" = -check ]; then
  if [ ${#missing[@]} -gt 0 ]; then
    echo "deps: missing packages: ${missing[*]} (scripts/deps.sh installs them)" >&2
    exit 1
  fi
  echo "deps: every package is installed; $have"
  exit 0
fi
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  rest=()
  for p in "${missing[@]}"; do
    if [ "$p" = qemu-user ]; then
      # Without its recommended qemu-user-binfmt, which would register
      # qemu for foreign binaries machine-wide: scripts/test386.sh calls
      # qemu-i386 itself.
      "${sudo[@]}" apt-get install -y -qq --no-install-recommends qemu-user >/dev/null
    else
      rest+=("$p")
    fi
  done
  if [ ${#rest[@]} -gt 0 ]; then
    "${sudo[@]}" apt-get install -y -qq "${rest[@]}" >/dev/null
  fi
fi
echo "deps: every package is installed; $have"
