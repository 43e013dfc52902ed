#!/usr/bin/env bash
# The test suite: fetch the models (idempotent, SHA-256 verified), check formatting and lints,
# then every test including the slow ones, on optimised code.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/models.py smollm2 qwen05
cargo fmt --all -- --check
cargo clippy -j2 --release --workspace --all-targets -- -D warnings
cargo test -j2 --release --workspace -- --include-ignored
