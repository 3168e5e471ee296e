#!/usr/bin/env bash
# Regenerate every table in BENCHMARKS.md. Each benchmark prints markdown into bench-out/NAME.md
# (and JSON/SVG beside it); BENCHMARKS.md is then assembled from scripts/BENCHMARKS.md.in, whose
# `@@TABLE NAME@@` lines are replaced by bench-out/NAME.md. No figure is typed by hand. bench-out/
# is kept in git, so that a run of some benchmarks on a new machine keeps the others' last tables.
#   scripts/bench.sh                 # every benchmark (about an hour on a 2-core VM)
#   scripts/bench.sh kv stream       # only these, reusing the other tables' last output
#   scripts/bench.sh summary         # the predicted-vs-measured table from bench-out/*.json
#   scripts/bench.sh assemble        # only BENCHMARKS.md again, from bench-out/*.md as they are
# `threads` (first in the full list) compares the worker threads of Mesa's software rasterizer.
# `calibrate` (next) measures this machine's constants for the predictions.
# When it is in the list, it runs again before each later benchmark that predicts (resident,
# stream, kv, s3), so that each prediction uses constants measured minutes before it (the shared
# VM's speed drifts over an hour); bench-out/recalibrations.md lists every calibration's
# headline constants. RECALIBRATE=1 does the same when calibrate is not in the list (adding its
# rows to that list).
# KV_FLAGS adds flags to `bench kv` (its defaults are the 4,096-token S2; a slow adapter may need
# e.g. KV_FLAGS="--prompt-tokens 1024 -n 64"), PPL_FLAGS to `bench ppl` (e.g. "--chunks 2"); the
# tables name the commands as run. `ppl` times nothing and comes last in the full list, so
# other work on the machine may overlap it.
# Side-by-side tables run only when asked, with what they compare against:
#   OLD_FLASHLM=/path/to/older/flashlm scripts/bench.sh compare   # two builds, resident speed
#   OLD_FLASHLM=/path/to/older/flashlm scripts/bench.sh compare-long   # the same on a long prompt
#   OLD_FLASHLM=... scripts/bench.sh compare-step compare-step-long   # the same two, kept apart:
#     a change's own side-by-side against the build before it (compare: against the wave's start)
#   LLAMA_BENCH=/path/to/llama-bench LLAMA_COMMIT=<hash> scripts/bench.sh llamacpp
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-gpu.sh
scripts/fetch-model.sh
cargo build --release
mkdir -p bench-out
B=./target/release/flashlm
want=("$@")
[ ${#want[@]} -eq 0 ] && want=(threads calibrate resident layouts io stream kv types s3 batch summary ppl)
machine() {
  echo "Machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, $(uname -m); $($B --list-adapters 2>/dev/null | head -1); $(date -u +%Y-%m-%d)"
}
calibrated=${RECALIBRATE:-0}
recal_line() {
  python3 - "$1" "$HOME/.cache/flashlm/calibration.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
best = max((f["gb_s"] for f in c["flash"] if f["mode"] == "direct"), default=0)
pts = sorted(c.get("overlap_points") or [], key=lambda p: p["layer_bytes"])
beta = ", ".join(f'{p["beta"]:.2f} ({p["layer_bytes"] / 1e6:.1f} MB layers)' for p in pts) or f'{c["overlap_beta"]:.2f}'
print(f'| {sys.argv[1]} | {best:.3f} | {c.get("compute_scale", 1):.2f} | {beta} |')
PY
}
for w in "${want[@]}"; do
  [ "$w" = assemble ] && continue
  if [ "$calibrated" = 1 ] && [[ "$w" =~ ^(resident|stream|kv|s3)$ ]]; then
    echo "## calibrate again before $w" >&2
    $B calibrate > /dev/null
    recal_line "before $w ($(date -u +%H:%M))" >> bench-out/recalibrations.md
  fi
  case "$w" in
    resident) cmd=($B bench resident --runs 5 --json bench-out/resident.json) ;;
    layouts)  cmd=($B bench layouts --rounds 9 --json bench-out/layouts.json) ;;
    io)       cmd=($B bench io --bytes 64MiB --json bench-out/io.json --plot bench-out/io.svg) ;;
    stream)   cmd=($B bench stream --io direct --runs 3 --json bench-out/stream.json) ;;
    kv)       cmd=($B bench kv --io direct --runs 3 ${KV_FLAGS:-} --json bench-out/kv.json) ;;
    ppl)      cmd=($B bench ppl ${PPL_FLAGS:-} --json bench-out/ppl.json) ;;
    types)    cmd=($B bench types --runs 3 --json bench-out/types.json) ;;
    threads)  cmd=($B bench threads --rounds 5 --json bench-out/threads.json) ;;
    s3)       cmd=($B bench s3 --runs 3 -n 8 --json bench-out/s3.json) ;;
    batch)    cmd=($B bench batch --io direct --runs 3 -n 16 --json bench-out/batch.json) ;;
    summary)  cmd=($B bench summary --dir bench-out --json bench-out/summary.json) ;;
    calibrate) cmd=($B calibrate) ;;
    compare)  cmd=(scripts/compare-decode.sh "${OLD_FLASHLM:?set OLD_FLASHLM to the older binary}" "$B" 7) ;;
    compare-long) cmd=(env PROMPT_FILE=scripts/long-prompt.txt TOKENS=8 scripts/compare-decode.sh "${OLD_FLASHLM:?set OLD_FLASHLM to the older binary}" "$B" 5) ;;
    compare-step) cmd=(scripts/compare-decode.sh "${OLD_FLASHLM:?set OLD_FLASHLM to the older binary}" "$B" 7) ;;
    compare-step-long) cmd=(env PROMPT_FILE=scripts/long-prompt.txt TOKENS=8 scripts/compare-decode.sh "${OLD_FLASHLM:?set OLD_FLASHLM to the older binary}" "$B" 5) ;;
    llamacpp) cmd=(scripts/compare-llamacpp.sh "${LLAMA_BENCH:?set LLAMA_BENCH to llama-bench}" 3) ;;
    *) echo "unknown benchmark $w (calibrate, threads, resident, layouts, io, stream, kv, ppl, types, s3, batch, summary, compare, compare-long, compare-step, compare-step-long, llamacpp)" >&2; exit 2 ;;
  esac
  echo "## $w: ${cmd[*]}" >&2
  {
    echo "\`${cmd[*]#./target/release/}\`"
    echo
    machine
    echo
    "${cmd[@]}"
  } > "bench-out/$w.md.part"
  mv "bench-out/$w.md.part" "bench-out/$w.md"
  if [ "$w" = calibrate ]; then
    calibrated=1
    {
      echo "| calibration | direct read, fastest, GB/s | compute factor | β |"
      echo "|---|---|---|---|"
      recal_line "first (§0, $(date -u +%H:%M))"
    } > bench-out/recalibrations.md
  fi
done
awk '
  /^@@TABLE [a-z0-9-]+@@$/ {
    name = $2; sub(/@@$/, "", name); f = "bench-out/" name ".md"
    if ((getline line < f) <= 0) { print "(not yet generated: run scripts/bench.sh " name ")"; next }
    print line; while ((getline line < f) > 0) print line; close(f); next
  }
  { print }
' scripts/BENCHMARKS.md.in > BENCHMARKS.md
echo "BENCHMARKS.md written" >&2
