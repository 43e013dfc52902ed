#!/usr/bin/env bash
# The tools the checks beyond `cargo test` need, each installed once (a no-op when present):
#   aarch64  the aarch64 Rust target, Debian's cross gcc and qemu-user   (scripts/aarch64.sh)
#   fuzz     a nightly toolchain and cargo-fuzz                          (scripts/fuzz.sh)
#   browser  Debian's chromium and playwright-core from npm              (scripts/browser_check.sh)
#   lm_eval  lm-evaluation-harness in its own venv, .venv-lmeval         (scripts/lm_eval.sh)
#   bash scripts/setup.sh aarch64 fuzz browser lm_eval
# scripts/test.sh runs it in the background while the workspace compiles.
set -euo pipefail
cd "$(dirname "$0")/.."
apt=()
for part in "$@"; do
  case "$part" in
    aarch64)
      command -v aarch64-linux-gnu-gcc >/dev/null || apt+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
      command -v qemu-aarch64 >/dev/null || apt+=(qemu-user)
      ;;
    browser) command -v chromium >/dev/null || apt+=(chromium) ;;
    fuzz | lm_eval) ;;
    *) echo "setup.sh: unknown part $part (aarch64, fuzz, browser, lm_eval)" >&2; exit 2 ;;
  esac
done
# One apt run for every part: two at once would fight over its lock.
if [ ${#apt[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt[@]}" >/dev/null
fi
for part in "$@"; do
  case "$part" in
    aarch64)
      rustup target list --installed | grep -qx aarch64-unknown-linux-gnu ||
        rustup target add aarch64-unknown-linux-gnu
      ;;
    fuzz)
      rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
      command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --jobs 2
      ;;
    browser) (cd scripts/browser && npm ci --silent --no-audit --no-fund) ;;
    lm_eval)
      [ -x .venv-lmeval/bin/lm_eval ] || python3 -m venv .venv-lmeval
      .venv-lmeval/bin/pip install --quiet --disable-pip-version-check -r scripts/lm_eval-requirements.txt
      ;;
  esac
done
