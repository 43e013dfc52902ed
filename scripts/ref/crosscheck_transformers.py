#!/usr/bin/env python3
"""Cross-check the committed reference logits (logits_fixture.py / numpy_llm.py) against a second
independent implementation: transformers' own GGUF model loading (its own dequantizer, torch
float32 forward). Expect max |diff| of ~1e-2 (the fixture is float16-rounded) and equal top-5.

Usage: python3 scripts/ref/crosscheck_transformers.py [smollm2|qwen05 ...]   (default: both)
Packages: scripts/ref/requirements.txt (transformers 5.23.0, torch 2.15.0, accelerate 1.15.0).
"""
import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from tokenizer_fixture import MODELS, ROOT, TARGETS


def check(key):
    fx = ROOT / "tests" / "fixtures" / f"logits_{key}"
    j = json.loads(fx.with_suffix(".json").read_text())
    ref = np.fromfile(fx.with_suffix(".f16"), dtype="<f2").reshape(-1, j["vocab"])
    model = AutoModelForCausalLM.from_pretrained(str(MODELS), gguf_file=TARGETS[key],
                                                 dtype=torch.float32).eval()
    worst, ok = 0.0, True
    for p in j["prompts"]:
        with torch.no_grad():
            out = model(torch.tensor([p["ids"]])).logits[0, -1].numpy()
        d = float(np.abs(out - ref[p["offset"]].astype(np.float32)).max())
        same = [int(t) for t in np.argsort(-out, kind="stable")[:5]] == p["top5"]
        worst, ok = max(worst, d), ok and same
        print(f"  {key} {p['name']:24} max|diff| {d:.4f}  top5 equal {same}")
    print(f"{key}: worst max|diff| {worst:.4f}, all top5 equal: {ok}")
    return ok and worst < 0.05


if __name__ == "__main__":
    results = [check(k) for k in sys.argv[1:] or list(TARGETS)]
    sys.exit(0 if all(results) else 1)
