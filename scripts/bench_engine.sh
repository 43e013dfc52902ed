#!/usr/bin/env bash
# Engine speed against llama.cpp on the same GGUF, same threads, same run.
# llama.cpp comes from scripts/llama_venv.sh (.venv-bench/). Not part of CI.
# Usage: bash scripts/bench_engine.sh [MODEL ...]   (default: smollm2 qwen05)
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=("${@:-smollm2 qwen05}")
# shellcheck disable=SC2206
MODELS=(${MODELS[*]})
# shellcheck source=scripts/llama_venv.sh
source scripts/llama_venv.sh
python3 scripts/models.py "${MODELS[@]}"
cargo build -j2 --release --bin edgeprompt-bench --features edgeprompt-bench/candle
for m in "${MODELS[@]}"; do
  ./target/release/edgeprompt-bench engine --model "$m" --threads 2 --llama-python .venv-bench/bin/python
done
