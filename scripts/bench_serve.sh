#!/usr/bin/env bash
# Serving under Poisson load (EdgePrompt Figs. 4-5): the edge server (with its cloud node) and
# llama.cpp's own C++ server (`llama-server`, built from the llama.cpp source the pinned
# `llama-cpp-python` sdist vendors) on the same GGUF and threads, same run, the same cloud
# prompts and fresh private prompts at every rate and for each server. With BENCH=chat, the
# multi-turn workload (`edgeprompt-bench chat`: ShareGPT conversations, TTFT per turn).
# llama-server runs with as many parallel slots as our batch (BATCH, 8), 2048 tokens of context
# each, continuous batching and its prompt cache (slots keep their KV between turns): the bar
# users know. Not part of CI (the first build takes ~15 minutes on 2 cores).
# Usage: [BENCH=serve|chat] [BATCH=8] bash scripts/bench_serve.sh [MODEL] [extra bench flags]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-smollm2}"
shift || true
# shellcheck source=scripts/llama_server.sh
source scripts/llama_server.sh
SERVER=$LLAMA_SERVER
python3 scripts/models.py "$MODEL" sharegpt
cargo build -j2 --release --bin edgeprompt-bench
case "$MODEL" in
  smollm2) GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  qwen05) GGUF=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  qwen15) GGUF=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  *) GGUF="$MODEL" ;;
esac
PORT=8093
mkdir -p bench-out
BENCH="${BENCH:-serve}"
BATCH="${BATCH:-8}"
ARGS="-t 2 -np $BATCH -c $((BATCH * 2048))"
# shellcheck disable=SC2086
LD_LIBRARY_PATH="$(dirname "$SERVER")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$SERVER" -m "$GGUF" --alias "$MODEL" $ARGS --host 127.0.0.1 --port "$PORT" \
  >bench-out/llama-server.log 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  sleep 1
done
if ! curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || ! kill -0 "$PID" 2>/dev/null; then
  echo "llama-server did not come up on port $PORT (see bench-out/llama-server.log)" >&2
  exit 1
fi
./target/release/edgeprompt-bench "$BENCH" --model "$MODEL" --threads 2 --max-batch "$BATCH" \
  --llama-server "http://127.0.0.1:$PORT/v1" \
  --llama-server-args "llama-server ($LLAMA_SERVER_VERSION) $ARGS" "$@"
