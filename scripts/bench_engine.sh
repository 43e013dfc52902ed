#!/usr/bin/env bash
# Engine speed against llama.cpp on the same GGUF, same threads, same run.
# Installs llama.cpp through the `llama-cpp-python` registry package (built from source with
# cmake, ~8 minutes the first time) into .venv-bench/. Not part of CI.
# Usage: bash scripts/bench_engine.sh [MODEL ...]   (default: smollm2 qwen05)
set -euo pipefail
cd "$(dirname "$0")/.."
MODELS=("${@:-smollm2 qwen05}")
# shellcheck disable=SC2206
MODELS=(${MODELS[*]})
if ! command -v cmake >/dev/null; then
  apt-get update -qq && apt-get install -y -qq cmake >/dev/null
fi
if [ ! -x .venv-bench/bin/python ] || ! .venv-bench/bin/python -c "import llama_cpp" 2>/dev/null; then
  python3 -m venv .venv-bench
  echo "building llama-cpp-python (llama.cpp from source; several minutes)..."
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    .venv-bench/bin/pip install -q --no-cache-dir "llama-cpp-python==0.3.36"
fi
python3 scripts/models.py "${MODELS[@]}"
cargo build -j2 --release --bin edgeprompt
for m in "${MODELS[@]}"; do
  ./target/release/edgeprompt bench engine --model "$m" --threads 2 --llama-python .venv-bench/bin/python
done
