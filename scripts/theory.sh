#!/usr/bin/env bash
# Regenerates every THEORY.md figure: the full simulation grid (about two
# minutes on 2 cores) into docs/theory/results.md, and the plots as PNG.
# CI runs the reduced grid instead: go test ./internal/sim.
set -euo pipefail
cd "$(dirname "$0")/.."
out=docs/theory
mkdir -p "$out"
go run ./cmd/epochsketch sim -out "$out" > "$out/results.md"
if ! command -v rsvg-convert >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq librsvg2-bin >/dev/null
fi
for f in "$out"/*.svg; do
  rsvg-convert -o "${f%.svg}.png" "$f"
done
echo "wrote $out/results.md and $(ls "$out"/*.png | wc -l) plot(s)"
