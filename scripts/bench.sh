#!/usr/bin/env bash
# Regenerate every table in BENCHMARKS.md: prints markdown and writes JSON/SVG into bench-out/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh
cargo build --release
mkdir -p bench-out
B=./target/release/flashlm
echo "## resident"; $B bench resident --runs 5 --json bench-out/resident.json
echo "## io";       $B bench io --bytes 64MiB --json bench-out/io.json --plot bench-out/io.svg
echo "## stream";   $B bench stream --io direct --json bench-out/stream.json
