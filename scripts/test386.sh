#!/usr/bin/env bash
# The library's tests on GOARCH=386 (make test-core): 32-bit words, the
# atomic alignment and the count arithmetic of docs/DESIGN.md.
#
# A kernel with IA32 emulation runs the 32-bit test binary itself. One
# without it ("exec format error", CI's host and many containers) runs it
# under qemu-user's qemu-i386 (Debian's qemu-user, which scripts/deps.sh
# installs), with two settings qemu needs for a Go program:
#   GODEBUG=asyncpreemptoff=1  qemu-user delivers the runtime's preemption
#                              signals unreliably (crashes: "morestack on g0")
#   EPOCHSKETCH_QEMU=1         qemu-user crashes a Go program that forks, so
#                              the few tests that start a process (the go
#                              command, bible, a killed writer) skip here;
#                              they check files and the API, not 32-bit
#                              arithmetic, and the native runs run them.
# With neither, it says so and skips, unless CI is set, when it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'package main\nfunc main() {}\n' > "$tmp/main.go"
(cd "$tmp" && GOARCH=386 GOFLAGS=-mod=mod "$GO" build -o probe main.go 2>/dev/null)
# A kernel that runs it through binfmt_misc's qemu (qemu-user-binfmt) is
# not native: it takes the qemu settings below.
binfmt=/proc/sys/fs/binfmt_misc/qemu-i386
if "$tmp/probe" 2>/dev/null && ! { [ -r "$binfmt" ] && grep -qx enabled "$binfmt"; }; then
  GOARCH=386 "$GO" test ${SHORT:-} .
  exit
fi
if command -v qemu-i386 >/dev/null 2>&1; then
  echo "test386: this kernel cannot run 32-bit binaries: the tests run under qemu-i386"
  GOARCH=386 "$GO" test ${SHORT:-} -exec 'env GODEBUG=asyncpreemptoff=1 EPOCHSKETCH_QEMU=1 qemu-i386' .
  exit
fi
if [ -n "${CI:-}" ]; then
  echo "test386: this kernel cannot run 32-bit binaries and qemu-i386 is missing (scripts/deps.sh installs qemu-user); CI must run the 386 tests" >&2
  exit 1
fi
echo "test386: SKIPPED: this kernel cannot run 32-bit binaries (exec format error) and qemu-i386 is missing: scripts/deps.sh installs qemu-user"
