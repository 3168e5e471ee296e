#!/usr/bin/env bash
# One-shot check on a machine with a real GPU (about 10 minutes): kernel tests, bench resident,
# bench io, S1 and the half-model budget (bench stream), S2 (bench kv, short), S3 if time is
# left; everything lands in one results folder, with the adapter and the commit named.
#   scripts/gpu-check.sh [OUT_DIR]        # default: gpu-check-<date>
# Set FLASHLM_MODEL to use another model; WGPU_ADAPTER_NAME / WGPU_BACKEND to pick the adapter.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
start=$(date +%s)
left() { echo $(( 600 - ($(date +%s) - start) )); }
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$out/log.txt" >&2; }
step() { # name timeout command...
  local name=$1 t=$2; shift 2
  if [ "$(left)" -lt 20 ]; then log "$name: skipped (out of time)"; echo "skipped" > "$out/$name.status"; return; fi
  [ "$t" -gt "$(left)" ] && t=$(left)
  log "$name: $* (limit ${t}s)"
  timeout "$t" "$@" > "$out/$name.md" 2> "$out/$name.err"
  local rc=$?
  echo "$rc" > "$out/$name.status"
  log "$name: exit $rc"
}
scripts/fetch-model.sh >&2 || { log "the model could not be fetched"; exit 1; }
cargo build --release >&2 || { log "build failed"; exit 1; }
B=./target/release/flashlm
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host $(uname -srm), $(nproc) cores"
  $B --list-adapters 2>&1
} > "$out/machine.txt"
log "adapters: $(head -5 "$out/machine.txt" | tail -2 | tr '\n' ' ')"
CI=true step kernels 240 cargo test --release --test kernels --test kernels_quant --test kv_kernels
step resident 90 $B bench resident --runs 3 --json "$out/resident.json"
step io 90 $B bench io --bytes 64MiB --json "$out/io.json" --plot "$out/io.svg"
step stream 150 $B bench stream --io direct --runs 3 -n 24 --json "$out/stream.json"
step kv 150 $B bench kv --io direct --runs 1 --prompt-tokens 2048 -n 16 --ppl-chunks 0 --page-sweep 64 --json "$out/kv.json"
step s3 120 $B bench s3 --runs 3 -n 8 --json "$out/s3.json"
log "done in $(( $(date +%s) - start ))s: $out"
