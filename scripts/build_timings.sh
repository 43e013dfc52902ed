#!/usr/bin/env bash
# How long the product takes to build and how large it is: `cargo build --release --bin
# edgeprompt` from an empty target directory (the registry already fetched), with cargo's
# --timings, on this machine's cores. Writes docs/results/build.json (edgeprompt-bench report
# turns it into docs/results.md) and prints the ten slowest units.
#   bash scripts/build_timings.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/results/build.json}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cargo fetch >/dev/null
t0=$(date +%s.%N)
CARGO_TARGET_DIR=$dir cargo build -j"$(nproc)" --release --bin edgeprompt --timings >/dev/null 2>&1
t1=$(date +%s.%N)
python3 - "$dir" "$t0" "$t1" "$out" <<'PY'
import glob, json, re, subprocess, sys
d, t0, t1, out = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
html = open(sorted(glob.glob(f"{d}/cargo-timings/cargo-timing-*.html"))[-1]).read()
units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", html, re.S).group(1))
units.sort(key=lambda u: -u["duration"])
info = open("/proc/cpuinfo").read()
cpu = re.search(r"model name\s*:\s*(.*)", info).group(1)
flags = set(re.search(r"flags\s*:\s*(.*)", info).group(1).split())
simd = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni") if f in flags]
rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
cores = len(re.findall(r"^processor", info, re.M))
res = {
    "machine": {"cpu": cpu, "cores": cores, "simd": simd, "git_rev": rev},
    "command": "cargo build -j%d --release --bin edgeprompt (empty target directory)" % cores,
    "secs": round(t1 - t0, 1),
    "bytes": __import__("os").path.getsize(f"{d}/release/edgeprompt"),
    "units": len(units),
    "slowest": [{"unit": f"{u['name']} {u['version']}" + (f" ({u['target'].strip()})" if u["target"].strip() else ""),
                 "secs": round(u["duration"], 1)} for u in units[:10]],
}
json.dump(res, open(out, "w"), indent=1)
print(f"build: {res['secs']} s, {res['bytes'] / 1e6:.1f} MB, {res['units']} units on {cpu} ({cores} cores)")
for u in res["slowest"]:
    print(f"  {u['secs']:6.1f} s  {u['unit']}")
PY
