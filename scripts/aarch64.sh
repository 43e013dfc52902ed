#!/usr/bin/env bash
# The aarch64 kernels, proven without an ARM machine: the engine cross-built for
# aarch64-unknown-linux-gnu and run under qemu user-mode emulation on CPU models with and
# without the extensions, so each path runs: cortex-a53 (ARMv8.0: `neon`), cortex-a76
# (ARMv8.2 dotprod: `dotprod`), max (ARMv8.6+ i8mm: `i8mm`). There the engine's unit tests
# run (every kernel against the portable bits) and, on `max`, the kernel-paths test: a real
# model's logits on i8mm, dotprod, neon and the portable path, equal to each other and to the
# committed fixture that x86 reproduces too; and on `max` the model families (qwen3, llama 3,
# granite, smollm3, phi3, gemma2, qwen3moe, qwen35, qwen35moe, lfm2, gemma4 and E2B's shape)
# against llama.cpp's logits on their synthetic GGUFs (scripts/ref/synth.py, made by
# scripts/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
start=$(date +%s)
bash scripts/setup.sh aarch64
python3 scripts/models.py smollm2 qwen05
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
echo "aarch64: cross-building the engine's tests"
if ! built=$(cargo test -j2 --release --target "$target" -p edgeprompt-engine --lib \
  --test kernel_paths --test architectures --no-run 2>&1); then
  echo "$built" >&2
  exit 1
fi
echo "$built" >&2
# The test binaries, as cargo names them: "  Executable unittests src/lib.rs (path)".
exe() { grep -E "^ *Executable $1 \(" <<<"$built" | sed -E 's/.*\((.*)\)$/\1/'; }
lib=$(exe "unittests src/lib.rs")
paths=$(exe "tests/kernel_paths.rs")
families=$(exe "tests/architectures.rs")
export QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
for run in cortex-a53:neon cortex-a76:dotprod max:i8mm; do
  cpu=${run%%:*} level=${run##*:}
  echo "aarch64: engine unit tests on qemu -cpu $cpu (path $level)"
  QEMU_CPU=$cpu EDGEPROMPT_EXPECT_LEVEL=$level qemu-aarch64 "$lib" -q
done
echo "aarch64: kernel paths on a real model, qemu -cpu max (i8mm, dotprod, neon, portable)"
QEMU_CPU=max EDGEPROMPT_TEST_RUNNER=qemu-aarch64 qemu-aarch64 "$paths" --include-ignored
echo "aarch64: the model families against llama.cpp, qemu -cpu max"
QEMU_CPU=max qemu-aarch64 "$families" -q
echo "aarch64: done in $(( $(date +%s) - start )) s"
