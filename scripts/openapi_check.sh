#!/usr/bin/env bash
# The HTTP API against its own description: an edge server (SmolLM2, no cloud: system prompts
# computed here) on loopback, and schemathesis (property-based, from PyPI) sending what the
# schema allows and what it does not. Passes with no 5xx, every status and body as described,
# and the server still healthy after. Needs the release binary and .venv-test (scripts/test.sh).
#   bash scripts/openapi_check.sh [MAX_EXAMPLES]
set -euo pipefail
cd "$(dirname "$0")/.."
examples=${1:-50}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$(mktemp)
# A small KV budget: answers stay short, and long ones are the documented 429.
./target/release/edgeprompt serve --model smollm2 --listen "127.0.0.1:$port" \
  --kv-budget-mb 2 --default-max-tokens 8 >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done
.venv-test/bin/schemathesis run "http://127.0.0.1:$port/openapi.json" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
  --max-examples "$examples" --seed 7 --request-timeout 60 --no-color
# Still alive and answering after everything it was sent.
kill -0 "$server"
curl -sf "http://127.0.0.1:$port/health" >/dev/null
echo "openapi check: the server answered every request as described and is healthy"
curl -s "http://127.0.0.1:$port/metrics" | grep '^edgeprompt_http_requests_total' || true
