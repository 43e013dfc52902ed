#!/usr/bin/env bash
# The test suite: fetch the models (idempotent, SHA-256 verified), redis-server and the openai
# client; check formatting and lints; run every test including the slow ones, optimised.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's time, so a slow one shows in CI's log. A failed step does not stop the others;
# every failure is listed at the end and the script fails if any did.
failed=()
step() {
  local t=$SECONDS rc=0
  "$@" || rc=$?
  if [ "$rc" -ne 0 ]; then
    failed+=("$* (exit $rc)")
    echo "[test.sh] FAILED after $(( SECONDS - t )) s (exit $rc): $*" >&2
  else
    echo "[test.sh] $(( SECONDS - t )) s: $*" >&2
  fi
}
# What the other steps need: without it nothing else can run.
python3 scripts/models.py smollm2 qwen05 qwen15 gemma3 sharegpt
# A real redis-server for the shared-tier test (Debian's package; the test starts its own).
if ! command -v redis-server >/dev/null; then
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
fi
# The real openai client for the HTTP API tests.
[ -x .venv-test/bin/python ] || python3 -m venv .venv-test
.venv-test/bin/pip install --quiet --disable-pip-version-check -r scripts/test-requirements.txt
mkdir -p target
# In the background while the workspace compiles: the later steps' tools (apt packages, Rust
# toolchains, venvs, npm), and the model families' synthetic GGUFs (random weights, written the
# same on every machine) that llama.cpp's reference logits in tests/fixtures/synth/ were taken on.
bash scripts/setup.sh aarch64 fuzz browser lm_eval >target/setup.log 2>&1 &
setup=$!
.venv-test/bin/python scripts/ref/synth.py >target/synth.log 2>&1 &
synth=$!
# A background job's exit status, its log printed.
finish() {
  local rc=0
  wait "$1" || rc=$?
  cat "$2" >&2
  return $rc
}
step cargo fmt --all -- --check
step cargo clippy -j2 --release --workspace --all-targets -- -D warnings
step finish $synth target/synth.log
# Every test binary, two at a time (scripts/run_tests.py), slow ones included.
step python3 scripts/run_tests.py -- --include-ignored
step cargo test -j2 --release --workspace --doc
# The engine's unit tests again on the AVX2 kernels: an AVX-512 machine ran its own above, and
# every path must give the portable bits.
# The binary the workspace run built (asking cargo for `-p edgeprompt-engine` alone would
# unify features differently and rebuild it).
engine_units() {
  local exe
  exe=$(cargo test -j2 --release --workspace --no-run 2>&1 |
    sed -nE 's/^ *Executable unittests src\/lib.rs \((.*edgeprompt_engine-[^)]*)\)$/\1/p')
  [ -n "$exe" ] || { echo "the engine's unit-test binary was not found" >&2; return 1; }
  EDGEPROMPT_AVX2=1 "$exe" -q
}
step engine_units
step finish $setup target/setup.log
# The aarch64 kernels under qemu emulation: the engine's unit tests on a CPU model for each
# path (neon, dotprod, i8mm) and a real model's logits on every path against the fixture.
step bash scripts/aarch64.sh
# The cargo-fuzz targets build (nightly, libFuzzer) and each runs 20 000 inputs from its seeds.
step bash scripts/fuzz.sh 20000
# The HTTP API against its OpenAPI description: schemathesis on a running edge (no 5xx, every
# status and body as described, the server healthy after).
step bash scripts/openapi_check.sh 50
# The chat page in headless Chromium (Debian's package, driven by playwright-core from npm):
# two streamed turns on a cold then warm cloud prompt, the timeline drawn, a screenshot.
step bash scripts/browser_check.sh target/browser/chat.png
# lm-evaluation-harness (unchanged, its own venv) against the edge: token-id, text, chat and
# `gguf` clients on tasks made from local data; the few-shot preamble as a cloud prompt must
# change no sample.
step bash scripts/lm_eval.sh --small
if [ ${#failed[@]} -gt 0 ]; then
  echo "[test.sh] ${#failed[@]} step(s) failed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "[test.sh] every step passed in $SECONDS s" >&2
