#!/usr/bin/env bash
# The chat page in a real browser: a cloud node, a shaped link (wifi) and `edgeprompt serve`
# on loopback, and headless Chromium (Debian's package) driven by playwright-core (npm) through
# two chat turns (scripts/browser/chat.mjs). Needs the release binary and the model.
#   bash scripts/browser_check.sh [SCREENSHOT.png]      (MODEL=smollm2 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-smollm2}
shot=${1:-target/browser/chat.png}
mkdir -p "$(dirname "$shot")"
bash scripts/setup.sh browser
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cloud=$(port); link=$(port); edge=$(port); keyed=$(port)
logs=$(mktemp -d)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
bin=./target/release/edgeprompt
# The cloud's signing key, and the edge's pin of it, live with this run.
$bin cloud --model "$model" --prompts scripts/browser/prompts.toml --listen "127.0.0.1:$cloud" \
  --data-dir "$logs" >"$logs/cloud" 2>&1 &
pids+=($!)
$bin link --listen "127.0.0.1:$link" --upstream "127.0.0.1:$cloud" --profile wifi >"$logs/link" 2>&1 &
pids+=($!)
# Every layer from the cloud, and only when asked (no prefetch), so the first turn is cold and
# the timeline shows the whole stream.
$bin serve --model "$model" --cloud "http://127.0.0.1:$link" --listen "127.0.0.1:$edge" \
  --cloud-layers-from 0 --prefetch-mb 0 --known-clouds "$logs/known_clouds" >"$logs/edge" 2>&1 &
pids+=($!)
# And an edge whose API wants a key, with no cloud.
$bin serve --model "$model" --listen "127.0.0.1:$keyed" --api-key sk-browser-check >"$logs/keyed" 2>&1 &
pids+=($!)
for p in $edge $keyed; do
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$p/ready" >/dev/null && break
    sleep 0.2
  done
done
if ! node scripts/browser/chat.mjs "http://127.0.0.1:$edge" "$shot" "http://127.0.0.1:$keyed" sk-browser-check; then
  for f in cloud link edge keyed; do echo "--- $f log"; tail -20 "$logs/$f"; done
  exit 1
fi
echo "browser check: the chat page streamed two answers and drew the timeline, and asked a keyed edge for its key; screenshot $shot"
