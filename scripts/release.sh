#!/usr/bin/env bash
# Release artifacts: static `edgeprompt` binaries for x86_64 and aarch64 Linux (musl, no shared
# library needed), the aarch64 one run under qemu, and a container image built FROM scratch
# around the x86_64 one, run as a cloud and an edge container answering a question on a cloud
# prompt over loopback.
#   bash scripts/release.sh            -> target/dist/edgeprompt-{x86_64,aarch64}-linux-musl
# Installs what it needs (rustup targets, Debian's musl-tools, gcc-aarch64-linux-gnu, qemu-user,
# podman). The image step is skipped, saying why, where podman cannot run containers.
set -euo pipefail
cd "$(dirname "$0")/.."
dist=target/dist
mkdir -p "$dist"
need=()
command -v musl-gcc >/dev/null || need+=(musl-tools)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
python3 scripts/models.py smollm2 >/dev/null

# The C parts (ring, zstd) of each target built by that target's compiler; Rust's own musl
# (self-contained) is linked in.
export CC_x86_64_unknown_linux_musl=musl-gcc
export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
for arch in x86_64 aarch64; do
  target=$arch-unknown-linux-musl
  rustup target list --installed | grep -qx "$target" || rustup target add "$target"
  t=$SECONDS
  cargo build -j2 --release --bin edgeprompt --target "$target"
  cp "target/$target/release/edgeprompt" "$dist/edgeprompt-$arch-linux-musl"
  echo "release: $target built in $((SECONDS - t)) s: $(stat -c %s "$dist/edgeprompt-$arch-linux-musl") bytes, $(file -b "$dist/edgeprompt-$arch-linux-musl" | cut -d, -f1-2)"
done

# Static: no interpreter, no shared library.
for arch in x86_64 aarch64; do
  kind=$(file -b "$dist/edgeprompt-$arch-linux-musl")
  if ! grep -Eq 'statically linked|static-pie linked' <<<"$kind"; then
    echo "release: $arch binary is not static: $kind" >&2
    exit 1
  fi
done

# The aarch64 binary on an emulated ARM CPU: its version, a model's facts and one answer.
arm=$dist/edgeprompt-aarch64-linux-musl
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
QEMU_CPU=max qemu-aarch64 "$arm" --version
facts=$(QEMU_CPU=max qemu-aarch64 "$arm" info --model "$model" 2>&1) ||
  { echo "release: info failed under qemu: $facts" >&2; exit 1; }
grep -q '"fingerprint"' <<<"$facts"
answer=$(QEMU_CPU=max qemu-aarch64 "$arm" generate --model "$model" --prompt "Name a colour." \
  --max-tokens 8 2>/dev/null)
[ -n "$answer" ] || { echo "release: the aarch64 binary gave no answer" >&2; exit 1; }
echo "release: aarch64 under qemu answered: $answer"

# The image: the static binary and nothing else.
if ! podman info >/dev/null 2>&1; then
  echo "release: podman cannot run here ($(podman info 2>&1 | tail -1)); image not built"
  exit 0
fi
ctx=$(mktemp -d)
data=$(mktemp -d)
cp "$dist/edgeprompt-x86_64-linux-musl" "$ctx/edgeprompt"
printf 'FROM scratch\nCOPY edgeprompt /edgeprompt\nENV HOME=/data\nENTRYPOINT ["/edgeprompt"]\n' >"$ctx/Containerfile"
podman build -q -t edgeprompt:latest "$ctx" >/dev/null
echo "release: image edgeprompt:latest, $(podman image inspect edgeprompt:latest --format '{{.Size}}') bytes"
# podman's defaults first; inside a container without cgroup v2 or the right to raise
# limits (these machines), runc with cgroupfs and limits no higher than the host's.
pod=(podman)
run=(--rm)
if ! "${pod[@]}" run "${run[@]}" edgeprompt:latest --version >/dev/null 2>&1; then
  pod=(podman --runtime runc --cgroup-manager=cgroupfs)
  run=(--rm --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
fi
"${pod[@]}" run "${run[@]}" edgeprompt:latest --version
trap '"${pod[@]}" rm -f ep-cloud ep-edge >/dev/null 2>&1 || true; rm -rf "$ctx" "$data"' EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cloud=$(port) edge=$(port)
cp scripts/browser/prompts.toml "$data/prompts.toml"
cp "$model" "$data/model.gguf"
mkdir -p "$data/cloud" "$data/edge"
"${pod[@]}" run -d "${run[@]:1}" --name ep-cloud --network host -v "$data:/data" edgeprompt:latest \
  cloud --model /data/model.gguf --prompts /data/prompts.toml --listen "127.0.0.1:$cloud" \
  --data-dir /data/cloud >/dev/null
"${pod[@]}" run -d "${run[@]:1}" --name ep-edge --network host -v "$data:/data" edgeprompt:latest \
  serve --model /data/model.gguf --cloud "http://127.0.0.1:$cloud" --listen "127.0.0.1:$edge" \
  --known-clouds /data/edge/known_clouds >/dev/null
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$edge/ready" >/dev/null && break
  sleep 0.2
done
ask='{"model":"/data/model.gguf","cloud_prompt":"rail-support","messages":[{"role":"user","content":"Can I bring my dog on the train?"}],"max_tokens":24,"temperature":0}'
got=""
for _ in $(seq 60); do
  got=$(curl -s "http://127.0.0.1:$edge/v1/chat/completions" -H 'content-type: application/json' -d "$ask" || true)
  grep -q '"source":"cloud"' <<<"$got" && break
  sleep 1
done
if ! grep -q '"source":"cloud"' <<<"$got"; then
  echo "release: the edge container did not answer from the cloud container's KV: $got" >&2
  "${pod[@]}" logs ep-cloud >&2 || true
  "${pod[@]}" logs ep-edge >&2 || true
  exit 1
fi
echo "release: the cloud and edge containers answered: $(python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' <<<"$got")"
