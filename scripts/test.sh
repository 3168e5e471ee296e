#!/usr/bin/env bash
# The test command: installs what the tests need (a Vulkan driver, lavapipe when no GPU driver
# is present, and the default model), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh
cargo test "$@"
