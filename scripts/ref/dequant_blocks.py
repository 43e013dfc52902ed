#!/usr/bin/env python3
"""Blocks of every format the engine expands (`crates/engine/src/dequant.rs`) and the values the
`gguf` package's own dequantizer (an implementation independent of ours, written from
llama.cpp's) gives for them: tests/fixtures/dequant/<format>.bin, the blocks' bytes followed by
their values as little-endian f32.

    .venv-test/bin/python scripts/ref/dequant_blocks.py

Random bytes with each block's float16 scale (and min) set to a finite value, so every bit of
the quants is exercised and no value is NaN.
"""
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "dequant"
BLOCKS = 8
# Byte offsets of the float16 fields of a block (scale, min, ...).
HALVES = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.IQ4_NL: [0], Q.IQ4_XS: [0],
}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(65)
    for qt, halves in HALVES.items():
        per, size = gguf.GGML_QUANT_SIZES[qt]
        raw = rng.integers(0, 256, (BLOCKS, size), dtype=np.uint8)
        for pos in halves:
            v = rng.uniform(-2.0, 2.0, BLOCKS).astype(np.float16)
            raw[:, pos:pos + 2] = v.reshape(BLOCKS, 1).view(np.uint8)
        values = gguf.quants.dequantize(raw.reshape(1, -1), qt).astype("<f4").reshape(-1)
        assert values.size == BLOCKS * per and np.isfinite(values).all()
        name = qt.name.lower()
        (OUT / f"{name}.bin").write_bytes(raw.tobytes() + values.tobytes())
        print(f"{name}: {BLOCKS} blocks, {values.size} values")
    for qt in (Q.F16, Q.BF16):
        x = rng.standard_normal(64).astype(np.float32) * 3
        raw = gguf.quants.quantize(x, qt)
        values = gguf.quants.dequantize(raw, qt).astype("<f4")
        (OUT / f"{qt.name.lower()}.bin").write_bytes(raw.tobytes() + values.tobytes())
        print(f"{qt.name.lower()}: {values.size} values")


if __name__ == "__main__":
    main()
