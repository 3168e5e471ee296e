#!/usr/bin/env bash
# The test command: installs what the tests need (a Vulkan driver, lavapipe when no GPU driver
# is present, the default model, the oracles' Python packages, and for the server tests the
# openai Python client and Chromium), then runs the whole suite and prints one total line.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh

# The gguf Python package (ggml's own reader, pinned) and numpy: the oracles that tests check
# synthetic files' tensor tables and the architectures' forward passes against. Installed in a
# virtual environment in the cache folder (else for the user) and handed to the tests as
# FLASHLM_PYTHON.
GGUF_PY=0.19.0
NUMPY_PY=2.4.6
venv="${FLASHLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/flashlm}/pyenv"
has_gguf() {
  "$1" -c "import importlib.metadata as m, sys; sys.exit(m.version('gguf') != '$GGUF_PY' or m.version('numpy') != '$NUMPY_PY')" 2>/dev/null
}
if has_gguf "$venv/bin/python"; then
  export FLASHLM_PYTHON="$venv/bin/python"
elif python3 -m venv "$venv" && "$venv/bin/python" -m pip install --quiet "gguf==$GGUF_PY" "numpy==$NUMPY_PY"; then
  export FLASHLM_PYTHON="$venv/bin/python"
else
  echo "no virtual environment: installing gguf==$GGUF_PY for the user"
  python3 -m pip install --quiet --user "gguf==$GGUF_PY" "numpy==$NUMPY_PY" ||
    python3 -m pip install --quiet --user --break-system-packages "gguf==$GGUF_PY" "numpy==$NUMPY_PY"
  export FLASHLM_PYTHON=python3
fi
# The server tests' openai client goes into the same environment.
export PYTHON="$FLASHLM_PYTHON"
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
