#!/usr/bin/env bash
# request-files.sh counts the SketchProxy source files one request through
# Middleware.ServeHTTP runs code in (sketchproxy/internal/reqfiles), from a
# build with coverage counters; it fails if an admitted or a refused
# request runs in more than MAX files (default below).
set -euo pipefail
MAX=${MAX:-8}
GO=${GO:-go}
cd "$(dirname "$0")/../sketchproxy"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
$GO build -cover -covermode=atomic -coverpkg=./... -o "$bin/reqfiles" ./internal/reqfiles
mkdir "$bin/cov"
GOCOVERDIR="$bin/cov" "$bin/reqfiles" -max "$MAX"
