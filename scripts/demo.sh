#!/usr/bin/env bash
# The demo: sets up a GPU driver if needed and the default model, then completes a prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh
cargo run --release -- run --prompt "${1:-The capital of France is}" -n "${2:-48}" --temp 0
