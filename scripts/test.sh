#!/usr/bin/env bash
# The test command: installs what the tests need (a Vulkan driver, lavapipe when no GPU driver
# is present, the default model, and for the server tests the openai Python client and
# Chromium), then runs the whole suite and prints one total line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh
scripts/setup-serve-tests.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
