#!/usr/bin/env bash
# Engine speed per GGUF file type on models of real size: Qwen2.5-Coder 0.5B and 1.5B
# requantized from their Q4_K_M by llama.cpp's own quantizer (--allow-requantize: no f16 of
# them is reachable), against llama.cpp on the same file, threads and token ids in the same
# run. llama.cpp comes from scripts/llama_venv.sh (.venv-bench/). Not part of CI.
# Usage: bash scripts/bench_formats.sh [FTYPE ...]   (default: Q5_K_M)
#        MODELS="qwen05" bash scripts/bench_formats.sh Q5_K_M Q3_K_M
#        -> bench-out/engine-<model>-<ftype>.json
set -euo pipefail
cd "$(dirname "$0")/.."
FTYPES=("${@:-Q5_K_M}")
# shellcheck disable=SC2206
MODELS=(${MODELS:-qwen05 qwen15})
# shellcheck source=scripts/llama_venv.sh
source scripts/llama_venv.sh
python3 scripts/models.py "${MODELS[@]}" sharegpt
cargo build -j2 --release --bin edgeprompt-bench
declare -A FILE=([qwen05]=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf [qwen15]=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf)
mkdir -p models/requant bench-out
for m in "${MODELS[@]}"; do
  for ftype in "${FTYPES[@]}"; do
    lower=$(tr '[:upper:]' '[:lower:]' <<<"$ftype")
    q="models/requant/$m.$lower.gguf"
    if [ ! -f "$q" ]; then
      .venv-bench/bin/python scripts/ref/quantize.py "models/${FILE[$m]}" "$q" "$ftype"
    fi
    ./target/release/edgeprompt-bench engine --model "$q" --threads 2 --skip-candle \
      --llama-python .venv-bench/bin/python
    mv "bench-out/engine-${q//\//_}.json" "bench-out/engine-$m-$lower.json"
  done
done
