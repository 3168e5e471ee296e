#!/usr/bin/env bash
# Side by side with llama.cpp on the same adapter and model: llama.cpp's llama-bench (a build
# of yours, from outside this repository, e.g. with its Vulkan backend) and flashlm bench
# resident, run in turn, each the prompt-processing (64 tokens) and generation (64 tokens)
# speed, medians over the rounds, as a markdown table.
#   scripts/compare-llamacpp.sh LLAMA_BENCH [ROUNDS] [extra llama-bench flags...]
# Env: FLASHLM_MODEL (default model otherwise), LLAMA_COMMIT (named in the table).
set -euo pipefail
lb=${1:?usage: scripts/compare-llamacpp.sh LLAMA_BENCH [ROUNDS] [llama-bench flags]}
rounds=${2:-3}
shift 2 || shift $#
model=${FLASHLM_MODEL:-${FLASHLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/flashlm}/SmolLM2-135M-Instruct.Q4_1.gguf}
B=./target/release/flashlm
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$rounds"); do
  "$lb" -m "$model" -p 64 -n 64 -r 1 -o json "$@" > "$tmp/llama-$i.json" 2> "$tmp/llama-$i.err"
  "$B" bench resident -m "$model" --runs 1 --json "$tmp/flashlm-$i.json" > /dev/null 2>&1
done
python3 - "$tmp" "$rounds" "${LLAMA_COMMIT:-unknown}" "$*" <<'PY'
import json, statistics, sys, pathlib
tmp, rounds, commit, flags = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
pp, tg, fp, fd, dev = [], [], [], [], ""
for i in range(1, rounds + 1):
    for t in json.loads((tmp / f"llama-{i}.json").read_text()):
        dev = t.get("gpu_info") or t.get("backends") or dev
        (pp if t["n_prompt"] > 0 else tg).append(t["avg_ts"])
    f = json.loads((tmp / f"flashlm-{i}.json").read_text())
    fp.append(f["prefill_tok_s"]); fd.append(f["decode_tok_s"])
m = statistics.median
print(f"llama.cpp commit {commit} ({dev}), llama-bench flags: -p 64 -n 64 {flags}; {rounds} rounds in turn, medians\n")
print("| engine | prompt processing, 64 tokens, tok/s | generation, 64 tokens, tok/s |")
print("|---|---|---|")
print(f"| llama.cpp llama-bench | {m(pp):.1f} | {m(tg):.2f} |")
print(f"| flashlm bench resident | {m(fp):.1f} | {m(fd):.2f} |")
print(f"| flashlm / llama.cpp | {m(fp) / m(pp):.2f} | {m(fd) / m(tg):.2f} |")
PY
