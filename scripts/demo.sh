#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model, build, and answer a chat whose
# system prompt is the (public) cloud part and whose user message is the private part.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-qwen05}"
python3 scripts/models.py "$MODEL"
cargo build -j2 --release --bin edgeprompt
exec ./target/release/edgeprompt generate --model "$MODEL" \
  --system "You are the support assistant of Acme Rail. Answer in two sentences. Refund policy: tickets are refundable up to 24 hours before departure; after that, a 20% fee applies." \
  --prompt "I'm Dana Whitfield, booking 7781-XK, my train leaves in 6 hours. Can I get my money back?" \
  "$@"
