#!/usr/bin/env bash
# What the `flashlm serve` tests need beyond Rust: the official openai Python client (pinned)
# and Debian's Chromium for the chat-page test. Each is installed only when missing.
set -euo pipefail
OPENAI_VERSION=3.57.0
PY=${PYTHON:-python3}
if ! "$PY" -c "import openai, sys; sys.exit(openai.__version__ != '$OPENAI_VERSION')" 2>/dev/null; then
  echo "installing openai==$OPENAI_VERSION for the server tests..."
  pip=("$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)
  "${pip[@]}" "openai==$OPENAI_VERSION" ||
    "${pip[@]}" --user "openai==$OPENAI_VERSION" ||
    "${pip[@]}" --user --break-system-packages "openai==$OPENAI_VERSION"
fi
if [ "$(uname -s)" = Linux ] && ! command -v chromium >/dev/null 2>&1; then
  echo "installing chromium for the chat-page test..."
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null
fi
