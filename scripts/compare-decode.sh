#!/usr/bin/env bash
# Side by side: resident decode and prefill speed of two flashlm binaries (e.g. a build of an
# earlier commit against this one), run in turn N times on the same prompt and model, with
# medians and the ratio of medians, as a markdown table.
#   scripts/compare-decode.sh OLD_BINARY [NEW_BINARY] [RUNS]
# Env: FLASHLM_MODEL (default model otherwise), PROMPT (or PROMPT_FILE, a file holding it: long
# prompts, whose prefill the attention kernels dominate), TOKENS (decoded per run, default 64).
set -euo pipefail
old=${1:?usage: scripts/compare-decode.sh OLD_BINARY [NEW_BINARY] [RUNS]}
new=${2:-./target/release/flashlm}
runs=${3:-7}
prompt=${PROMPT:-"Once upon a time, in a small village by the sea, there lived an old fisherman who"}
[ -n "${PROMPT_FILE:-}" ] && prompt=$(cat "$PROMPT_FILE")
tokens=${TOKENS:-64}
model=()
[ -n "${FLASHLM_MODEL:-}" ] && model=(-m "$FLASHLM_MODEL")
one() { # binary -> "prefill decode" tok/s, tokens decoded, prompt tokens (greedy; exactly $tokens tokens where the binary can)
  local extra=()
  "$1" run --help 2>/dev/null | grep -q -- --ignore-eos && extra=(--ignore-eos)
  "$1" run "${model[@]}" -p "$prompt" -n "$tokens" --temp 0 "${extra[@]}" 2>&1 >/dev/null |
    sed -n 's/.*prefill: \([0-9]*\) tokens, \([0-9.]*\) tok\/s | decode: \([0-9]*\) tokens, \([0-9.]*\) tok\/s.*/\2 \4 \3 \1/p'
}
med() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
: > /tmp/compare-decode.$$
for i in $(seq "$runs"); do
  echo "old $(one "$old")" >> /tmp/compare-decode.$$
  echo "new $(one "$new")" >> /tmp/compare-decode.$$
done
col() { awk -v w="$1" -v c="$2" '$1 == w { print $c }' /tmp/compare-decode.$$ | med; }
op=$(col old 2); od=$(col old 3); np=$(col new 2); nd=$(col new 3)
echo "$(nproc) cores; $("$new" --list-adapters 2>/dev/null | head -1); $runs runs of each, in turn; prompt: $(awk '$1 == "new" { print $5 }' /tmp/compare-decode.$$ | sort -u | tr '\n' ' ')tokens; decode: $tokens tokens (tokens actually decoded by the old binary: $(awk '$1 == "old" { print $4 }' /tmp/compare-decode.$$ | sort -u | tr '\n' ' '))"
echo
echo "| binary | prefill tok/s (median) | decode tok/s (median) |"
echo "|---|---|---|"
echo "| old: \`$old\` ($("$old" --version 2>/dev/null)) | $op | $od |"
echo "| new: \`$new\` ($("$new" --version 2>/dev/null)) | $np | $nd |"
echo "| new / old | $(awk -v a="$np" -v b="$op" 'BEGIN { printf "%.2f", a / b }') | $(awk -v a="$nd" -v b="$od" 'BEGIN { printf "%.2f", a / b }') |"
rm -f /tmp/compare-decode.$$
