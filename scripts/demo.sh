#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model, build, then run a cloud node, a
# shaped link and an edge node on loopback answering a chat whose private part never leaves
# the edge. Extra arguments go to `edgeprompt demo` (e.g. --link constrained --codec int4ch).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${MODEL:-qwen05}"
python3 scripts/models.py "$MODEL"
cargo build -j2 --release --bin edgeprompt
exec ./target/release/edgeprompt demo --model "$MODEL" "$@"
