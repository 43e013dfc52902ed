#!/usr/bin/env bash
# The cargo-fuzz targets (fuzz/): build them all and run each over its seeds and corpus.
#   bash scripts/fuzz.sh            # 20 000 runs a target (what scripts/test.sh does)
#   bash scripts/fuzz.sh 10000000   # a long run: 10 M executions a target
# Installs what it needs: a nightly toolchain (libFuzzer's coverage flags) and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20000}
targets=${TARGETS:-"wire header tokenizer chat http gguf"}
bash scripts/setup.sh fuzz
python3 scripts/models.py smollm2 qwen05 gemma3 >/dev/null
# No sanitizer: the targets are safe Rust; what is hunted is panics, aborts, OOM and hangs.
CARGO_BUILD_JOBS=2 cargo +nightly fuzz build -s none
# One target per core: each libFuzzer run is a single thread.
run() {
  local t=$1 log
  mkdir -p "fuzz/corpus/$t"
  seeds=()
  [ -d "fuzz/seeds/$t" ] && seeds=("fuzz/seeds/$t")
  log=$(mktemp)
  if ! cargo +nightly fuzz run -s none "$t" "fuzz/corpus/$t" "${seeds[@]}" -- \
    -runs="$runs" -max_len=4096 -rss_limit_mb=3072 -timeout=30 -print_final_stats=1 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz $t: failed; the input is in fuzz/artifacts/$t" >&2
    rm -f "$log"
    return 1
  fi
  echo "fuzz $t: $(grep -E '^stat::(number_of_executed_units|peak_rss_mb|slowest_unit_time_sec)' "$log" | tr '\n' ' ')"
  rm -f "$log"
}
pids=() failed=0
for t in $targets; do
  run "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$(nproc)" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
