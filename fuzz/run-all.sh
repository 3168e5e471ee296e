#!/usr/bin/env bash
# Runs fuzz targets for a number of executions (default 10 million each), one after another at
# low priority, from their corpus and seeds, then prints a markdown table of what each target's
# last run did (executions, rate, crashes, slowest input, peak memory) from libFuzzer's final
# stats in fuzz/logs/<target>.log. Run from the repository root after `cargo install
# cargo-fuzz` and `fuzz/make-seeds.sh`:
#   fuzz/run-all.sh [RUNS] [TARGET...]     # RUNS 0: only print the table of the last runs
# A run stopped before its end (no final stats) is counted up to its last status line and
# marked "stopped". Set FUZZ_KEEP=1 to keep a target's previous log as <target>.N.log (the
# table then has a row per run, each from the same growing corpus).
set -uo pipefail
runs=${1:-10000000}
shift || true
all=(gguf tokenizer chat_template kv_session kv_store)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
mkdir -p fuzz/logs
if [ "$runs" -gt 0 ]; then
  for t in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$t"
    if [ "${FUZZ_KEEP:-0}" = 1 ] && [ -f "fuzz/logs/$t.log" ]; then
      n=1; while [ -f "fuzz/logs/$t.$n.log" ]; do n=$((n + 1)); done
      mv "fuzz/logs/$t.log" "fuzz/logs/$t.$n.log"
    fi
    extra=()
    [ "$t" = gguf ] && extra=(-max_len=65536)
    nice -n 19 cargo +nightly fuzz run -s none "$t" "fuzz/corpus/$t" "fuzz/seeds/$t" -- \
      -runs="$runs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "${extra[@]}" \
      > "fuzz/logs/$t.log" 2>&1
    echo "exit $?" >> "fuzz/logs/$t.log"
  done
fi
echo "| target | executions | exec/s | crashes or timeouts | slowest input, s | peak RSS, MB | corpus entries |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for t in "${all[@]}"; do
  for log in fuzz/logs/$t.[0-9]*.log fuzz/logs/$t.log; do
  [ -f "$log" ] || continue
  stat() { awk -v k="stat::$1:" '$1 == k { v = $2 } END { print v + 0 }' "$log"; }
  crashes=$(grep -c -e "^SUMMARY: " -e "^Error: Fuzz target exited with signal" "$log")
  rc=$(awk '/^exit / { v = $2 } END { print v + 0 }' "$log")
  execs=$(stat number_of_executed_units)
  rate=$(stat average_exec_per_sec)
  if grep -q "libFuzzer: run interrupted" "$log"; then
    # Stopped by a signal (SIGTERM/SIGINT) before its count of runs: not a failure.
    execs="$execs (stopped)"
  elif [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
    crashes="exit $rc"
  fi
  if ! grep -q "^stat::number_of_executed_units:" "$log"; then
    # Stopped before libFuzzer printed its final stats: its last status line.
    execs=$(awk '/^#[0-9]+\t/ { v = substr($1, 2) } END { print v + 0 }' "$log")
    rate=$(awk '/^#[0-9]+\t/ { for (i = 1; i < NF; i++) if ($i == "exec/s:") v = $(i + 1) } END { print v + 0 }' "$log")
    execs="$execs (stopped)"
  fi
  corpus=$(find "fuzz/corpus/$t" -type f 2>/dev/null | wc -l)
  echo "| \`$t\` | $execs | $rate | $crashes | $(stat slowest_unit_time_sec) | $(stat peak_rss_mb) | $corpus |"
  done
done
