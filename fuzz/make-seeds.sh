#!/usr/bin/env bash
# Writes the seed corpora under fuzz/seeds/<target>/ (run from the repository root).
# GGUF, tokenizer and chat template seeds come from tests/fuzz_seeds.rs (synthetic models, the
# hostile fixtures, the first MiB of the default model when it is cached); session seeds are
# real session files saved by `flashlm run --session` on synthetic models.
set -euo pipefail
out=fuzz/seeds
FLASHLM_FUZZ_SEEDS="$PWD/$out" cargo test --test fuzz_seeds
cargo build --bin flashlm
bin="${CARGO_TARGET_DIR:-target}/debug/flashlm"
mkdir -p "$out/kv_session" "$out/kv_store"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in 0 1 2; do
    "$bin" run -m "$out/gguf/synthetic-$i.gguf" -p "hello world the" -n $((3 + i * 30)) \
        --ctx 256 --session "$tmp/s$i.bin" > /dev/null 2>&1
    # The first byte is the harness's flags (odd: recompute the checksums).
    { printf '\000'; cat "$tmp/s$i.bin"; } > "$out/kv_session/session-$i"
    { printf '\001'; cat "$tmp/s$i.bin"; } > "$out/kv_session/session-$i-fix"
done
# Page file damage: overwrite 4 bytes at 16, truncate to 48 KiB... (kind u8 | offset u32 | len u8).
printf '\000\020\000\000\000\004abcd' > "$out/kv_store/overwrite"
printf '\002\000\060\000\000\000' > "$out/kv_store/truncate"
printf '\003\000\000\001\000\000' > "$out/kv_store/extend"
ls -R "$out" | head -50
