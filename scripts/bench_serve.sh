#!/usr/bin/env bash
# Serving under Poisson load (EdgePrompt Figs. 4-5): the edge server (with its cloud node) and
# llama.cpp's OpenAI server (llama-cpp-python[server]) on the same GGUF and threads, same run,
# same requests. llama.cpp comes from scripts/llama_venv.sh (.venv-bench/). Not part of CI.
# Usage: bash scripts/bench_serve.sh [MODEL] [extra `edgeprompt-bench serve` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-smollm2}"
shift || true
# shellcheck source=scripts/llama_venv.sh
source scripts/llama_venv.sh
.venv-bench/bin/pip install -q "llama-cpp-python[server]==0.3.36"
python3 scripts/models.py "$MODEL" sharegpt
cargo build -j2 --release --bin edgeprompt-bench
case "$MODEL" in
  smollm2) GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  qwen05) GGUF=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  qwen15) GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  *) GGUF="$MODEL" ;;
esac
PORT=8093
.venv-bench/bin/python -m llama_cpp.server --model "$GGUF" --model_alias "$MODEL" \
  --n_threads 2 --n_ctx 4096 --interrupt_requests False --host 127.0.0.1 --port "$PORT" \
  >bench-out/llama-server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break
  sleep 1
done
./target/release/edgeprompt-bench serve --model "$MODEL" --threads 2 \
  --llama-server "http://127.0.0.1:$PORT/v1" "$@"
