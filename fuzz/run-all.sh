#!/usr/bin/env bash
# Runs fuzz targets for a number of executions (default 10 million each), one after another at
# low priority, from their corpus and seeds, then prints a markdown table of what each target's
# last run did (executions, rate, crashes, slowest input, peak memory) from libFuzzer's final
# stats in fuzz/logs/<target>.log. Run from the repository root after `cargo install
# cargo-fuzz` and `fuzz/make-seeds.sh`:
#   fuzz/run-all.sh [RUNS] [TARGET...]     # RUNS 0: only print the table of the last runs
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
  log="fuzz/logs/$t.log"
  [ -f "$log" ] || continue
  stat() { awk -v k="stat::$1:" '$1 == k { v = $2 } END { print v + 0 }' "$log"; }
  crashes=$(grep -c "^SUMMARY: " "$log")
  rc=$(awk '/^exit / { v = $2 } END { print v + 0 }' "$log")
  [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ] && crashes="exit $rc"
  corpus=$(find "fuzz/corpus/$t" -type f 2>/dev/null | wc -l)
  echo "| \`$t\` | $(stat number_of_executed_units) | $(stat average_exec_per_sec) | $crashes | $(stat slowest_unit_time_sec) | $(stat peak_rss_mb) | $corpus |"
done
