#!/usr/bin/env bash
# lm-evaluation-harness (the registry package, unchanged, in its own venv .venv-lmeval) against
# the edge server, on tasks made from local data (scripts/lm_eval/make_tasks.py): addition as
# multiple choice (loglikelihood) and as generation (generate_until) after an 8-example
# few-shot preamble, and ShareGPT perplexity (loglikelihood_rolling).
#
# Runs, each through the harness's own model classes:
#   ours        edge alone, local-completions with the server's tokenizer (token-id prompts)
#   ours-cloud  the same, the preamble a cloud prompt: every prompt begins with it, so the edge
#               runs each on the cloud's KV. Must score every sample exactly as `ours`.
#   ours-text   local-completions with text prompts (generation), like-for-like with llama-server
#   ours-chat   local-chat-completions (generation, chat template)
#   ours-gguf   the harness's `gguf` client (loglikelihood by text offsets, generation)
# and, unless --small, the same GGUF behind llama.cpp's llama-server (text and chat generation;
# it ignores echo: no prompt log-probabilities, so no loglikelihood), and llama.cpp's own
# log-likelihoods for the requests the harness sent us (scripts/lm_eval/llama_scores.py).
# Writes the table to stdout and JSON to $OUT/lm_eval.json.
#
#   bash scripts/lm_eval.sh            # qwen05, 100 items, 30 documents, baselines
#   bash scripts/lm_eval.sh --small    # the test suite's: smollm2, 12 items, 3 documents
set -euo pipefail
cd "$(dirname "$0")/.."
small=false
[ "${1:-}" = "--small" ] && small=true
if $small; then
  model=smollm2 items=12 docs=3 out=target/lm_eval-small
else
  model=${MODEL:-qwen05} items=${ITEMS:-100} docs=${DOCS:-30} out=${OUT:-bench-out/lm_eval}
fi
rm -rf "$out" && mkdir -p "$out/runs"
bash scripts/setup.sh lm_eval
python3 scripts/models.py "$model" sharegpt >/dev/null
cargo build -j2 --release --bin edgeprompt
case "$model" in
  smollm2) gguf=models/SmolLM2-135M-Instruct.Q4_1.gguf ;;
  qwen05) gguf=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ;;
  qwen15) gguf=models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf ;;
  *) echo "unknown model $model" >&2; exit 2 ;;
esac
.venv-lmeval/bin/python scripts/lm_eval/make_tasks.py "$out/tasks" --items "$items" --docs "$docs" \
  --sharegpt models/ShareGPT_V3_unfiltered_cleaned_split.json
# The harness must not reach for any hub: the tasks are local files.
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
up() { # URL PID: wait until it answers
  for _ in $(seq 600); do
    curl -sf "$1" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "server died: see $out/*.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "no answer from $1" >&2
  exit 1
}
bin=./target/release/edgeprompt
alone=$(port) cloud=$(port) edge=$(port)
$bin serve --model "$model" --listen "127.0.0.1:$alone" >"$out/alone.log" 2>&1 &
pids+=($!)
up "http://127.0.0.1:$alone/ready" $!
$bin cloud --model "$model" --prompts "$out/tasks/prompts.toml" --listen "127.0.0.1:$cloud" >"$out/cloud.log" 2>&1 &
pids+=($!)
# The edge pins the cloud's key for this run only.
rm -f "$out/known_clouds"
$bin serve --model "$model" --cloud "http://127.0.0.1:$cloud" --cloud-layers-from 0 \
  --listen "127.0.0.1:$edge" --known-clouds "$out/known_clouds" >"$out/edge.log" 2>&1 &
pids+=($!)
up "http://127.0.0.1:$edge/ready" $!
# The edge holds the preamble once a request has named it. The cloud may still be loading its
# model (it listens only then): ask until it answers.
for i in $(seq 120); do
  curl -sf "http://127.0.0.1:$edge/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$model\", \"cloud_prompt\": \"arith-fewshot\", \"prompt\": \"\\n\", \"max_tokens\": 1}" >/dev/null && break
  [ "$i" = 120 ] && { echo "the edge never got the preamble from the cloud (see $out/*.log)" >&2; exit 1; }
  sleep 0.5
done

lm() { # NAME MODEL_TYPE MODEL_ARGS TASKS [more harness flags]
  local name=$1 type=$2 args=$3 tasks=$4
  shift 4
  echo "lm_eval: $name ($type, $tasks)"
  if ! .venv-lmeval/bin/lm_eval --model "$type" --model_args "$args" --tasks "$tasks" \
    --include_path "$out/tasks" --output_path "$out/runs/$name" --log_samples --batch_size 1 \
    "$@" >"$out/runs/$name.log" 2>&1; then
    tail -30 "$out/runs/$name.log" >&2
    return 1
  fi
}
all=ep_arith_mc,ep_arith_gen,ep_sharegpt_ppl
remote="model=$model,tokenizer_backend=remote,tokenized_requests=True,max_retries=1,max_length=4096"
text="model=$model,tokenizer_backend=None,tokenized_requests=False,max_retries=1"
lm ours local-completions "$remote,base_url=http://127.0.0.1:$alone/v1/completions" $all
lm ours-cloud local-completions "$remote,base_url=http://127.0.0.1:$edge/v1/completions" $all
curl -s "http://127.0.0.1:$edge/metrics" | grep -E '^edgeprompt_prompt_prefix_matches_total' \
  >"$out/prefix_matches.txt" || true
lm ours-text local-completions "$text,base_url=http://127.0.0.1:$alone/v1/completions" ep_arith_gen
lm ours-chat local-chat-completions "$text,base_url=http://127.0.0.1:$alone/v1/chat/completions" \
  ep_arith_gen --apply_chat_template
lm ours-gguf gguf "base_url=http://127.0.0.1:$alone" ep_arith_mc,ep_arith_gen

if ! $small; then
  # shellcheck source=scripts/llama_server.sh
  source scripts/llama_server.sh
  ls=$(port)
  LD_LIBRARY_PATH="$(dirname "$LLAMA_SERVER")" "$LLAMA_SERVER" -m "$gguf" --alias "$model" \
    -t 2 -np 1 -c 4096 --jinja --host 127.0.0.1 --port "$ls" >"$out/llama-server.log" 2>&1 &
  pids+=($!)
  up "http://127.0.0.1:$ls/health" $!
  lm llama-server-text local-completions "$text,base_url=http://127.0.0.1:$ls/v1/completions" ep_arith_gen
  lm llama-server-chat local-chat-completions "$text,base_url=http://127.0.0.1:$ls/v1/chat/completions" \
    ep_arith_gen --apply_chat_template
  # What llama-server answers the harness's loglikelihood request.
  curl -s "http://127.0.0.1:$ls/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$model\", \"prompt\": \"1 + 1 =\", \"max_tokens\": 1, \"echo\": true, \"logprobs\": 1}" \
    >"$out/llama-server-echo.json" || true
  kill "${pids[-1]}"
  # Loglikelihoods from llama.cpp itself (llama-cpp-python in process) for the requests the
  # harness sent our server: no llama.cpp server answers them in useful time.
  # shellcheck source=scripts/llama_venv.sh
  source scripts/llama_venv.sh
  .venv-bench/bin/python scripts/lm_eval/llama_scores.py "$out" "$gguf"
fi
.venv-lmeval/bin/python scripts/lm_eval/compare.py "$out" --model "$model" $($small && echo --small)
