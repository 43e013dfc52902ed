#!/usr/bin/env bash
# Engine speed on the model families we have no weights for: synthetic GGUFs of real shapes
# (scripts/ref/synth.py: Qwen3-0.6B, Llama 3.2 1B, Qwen3-30B-A3B's experts), quantized to Q4_K_M
# by llama.cpp's own quantizer, against llama.cpp on the same file, threads and token ids in the
# same run. llama.cpp comes from scripts/llama_venv.sh (.venv-bench/). Not part of CI.
# Usage: bash scripts/bench_families.sh [SHAPE ...]   (default: all three) -> bench-out/engine-synth-*.json
#        FTYPE=Q5_K_M bash scripts/bench_families.sh qwen3-0.6b   (another llama.cpp file type)
#        EDGEPROMPT_AVX2=1 LLAMA_PYTHON=<venv>/bin/python bash scripts/bench_families.sh qwen35-0.8b
#          (the AVX2 kernels against a llama.cpp built without AVX-512: docs/engine.md)
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPES=("${@:-qwen3-0.6b llama3.2-1b qwen3moe-a3b}")
# shellcheck disable=SC2206
SHAPES=(${SHAPES[*]})
# shellcheck source=scripts/llama_venv.sh
source scripts/llama_venv.sh
.venv-bench/bin/pip install -q --disable-pip-version-check numpy==2.4.6 gguf==0.19.0
python3 scripts/models.py qwen05 sharegpt
cargo build -j2 --release --bin edgeprompt-bench
ftype=${FTYPE:-Q4_K_M}
lower=$(tr '[:upper:]' '[:lower:]' <<<"$ftype")
suffix=""
[ "$ftype" = Q4_K_M ] || suffix="-$lower"
dir=models/synth/bench
mkdir -p "$dir" bench-out
for s in "${SHAPES[@]}"; do
  q="$dir/$s.$lower.gguf"
  if [ ! -f "$q" ]; then
    .venv-bench/bin/python scripts/ref/synth.py "$s" --out "$dir"
    .venv-bench/bin/python scripts/ref/quantize.py "$dir/$s.gguf" "$q" "$ftype"
  fi
  ./target/release/edgeprompt-bench engine --model "$q" --threads 2 --skip-candle \
    --llama-python "${LLAMA_PYTHON:-.venv-bench/bin/python}"
  mv "bench-out/engine-${q//\//_}.json" "bench-out/engine-synth-$s$suffix.json"
done
