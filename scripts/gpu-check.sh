#!/usr/bin/env bash
# One-shot check on a machine with a real GPU (10 minutes of measuring after the build): kernel
# tests, calibrate, bench resident, bench layouts, bench io, S1 and the half-model budget
# (bench stream), S2 (bench kv, short), bench batch, S3 if time is left; everything lands in
# one results folder, with the adapter and the commit named. The build (and the test binaries)
# come first and are not counted in the 10 minutes.
#   scripts/gpu-check.sh [OUT_DIR]        # default: gpu-check-<date>
# Set FLASHLM_MODEL to use another model; WGPU_ADAPTER_NAME / WGPU_BACKEND to pick the adapter.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
start=$(date +%s)
budget=600
left() { echo $(( budget - ($(date +%s) - start) )); }
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
cargo test --release --no-run --test kernels --test kernels_quant --test kv_kernels >&2 ||
  { log "test build failed"; exit 1; }
B=./target/release/flashlm
# The measuring budget starts now.
start=$(date +%s)
{
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host $(uname -srm), $(nproc) cores"
  $B --list-adapters 2>&1
} > "$out/machine.txt"
log "adapters: $(head -5 "$out/machine.txt" | tail -2 | tr '\n' ' ')"
CI=true step kernels 150 cargo test --release --test kernels --test kernels_quant --test kv_kernels
# The performance model's constants for this machine (saved to the cache directory), so the
# benchmarks below print predictions next to what they measure.
step calibrate 60 $B calibrate
step resident 60 $B bench resident --runs 3 --json "$out/resident.json"
step layouts 60 $B bench layouts --rounds 5 --json "$out/layouts.json"
step io 60 $B bench io --bytes 64MiB --json "$out/io.json" --plot "$out/io.svg"
step stream 90 $B bench stream --io direct --runs 3 -n 24 --json "$out/stream.json"
step kv 90 $B bench kv --io direct --runs 1 --prompt-tokens 2048 -n 16 --page-sweep 64 --cache-share 0 --json "$out/kv.json"
step batch 60 $B bench batch --io direct --runs 3 -n 16 --json "$out/batch.json"
step s3 60 $B bench s3 --runs 3 -n 8 --json "$out/s3.json"
log "done in $(( $(date +%s) - start ))s: $out"
