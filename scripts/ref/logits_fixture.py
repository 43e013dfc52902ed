#!/usr/bin/env python3
"""Reference last-position logits from the independent numpy forward pass (numpy_llm.py).

Writes, for smollm2 and qwen05:
  tests/fixtures/logits_{key}.json  {"model", "vocab", "numpy", "gguf", "transformers", "note",
      "f64_max_abs_diff", "prompts": [{"name", "text", "ids", "top1", "top5", "top5_logits",
      "offset", "f64_max_abs_diff"}]}
  tests/fixtures/logits_{key}.f16   prompt i's full logit vector (vocab values, little-endian
      IEEE float16) at byte offset offset * vocab * 2, prompts concatenated in order.
ids come from the transformers GGUF tokenizer (tokenizer_fixture.load_tokenizer,
add_special_tokens=False); the ChatML prompts are written by hand. top1/top5 come from the
float32 logits before the f16 rounding. f64_max_abs_diff: max |logit_f32 - logit_f64| of the same
reference run in float64 -- the reference's own rounding noise.

Usage: python3 scripts/ref/logits_fixture.py [smollm2|qwen05 ...]   (default: both)
Packages: scripts/ref/requirements.txt (numpy 2.4.6, gguf 0.19.0, transformers 5.23.0, torch).
"""
import gc
import json
import sys
import time

from importlib.metadata import version

import numpy as np
import transformers

from numpy_llm import Model, chatml
from split_pairs import records
from tokenizer_fixture import MODELS, ROOT, SHAREGPT, TARGETS, load_tokenizer

RUST = """use std::collections::HashMap;

/// Count words in `text`, case-insensitively.
pub fn word_counts(text: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_insert(0) += 1;
    }
"""
PYTHON = """import json

def load(path):
    with open(path) as f:
        data = json.load(f)
    return [row for row in data if row.get("active")]

def main():
    rows = load("users.json")
    for row in rows:
        print(row["""


def sharegpt_excerpts(tok, n=3, lo=100, hi=400):
    """First human + gpt turns of ASCII conversations, cut at a line end to lo..hi tokens."""
    ntok = lambda s: len(tok.encode(s, add_special_tokens=False))
    out = []
    for r in records(SHAREGPT, limit=400)[7:]:
        lines = "\n\n".join(t["value"] for t in r.get("conversations", [])[:2]).split("\n")
        while len(lines) > 1 and ntok("\n".join(lines)) > hi:
            lines.pop()
        text = "\n".join(lines).rstrip()
        if text.isascii() and lo <= ntok(text) <= hi:
            out.append((r.get("id", "?"), text))
        if len(out) == n:
            break
    return out


def prompts(tok):
    p = [
        ("chat_capital", chatml("What is the capital of France?")),
        ("chat_sky", chatml("Why is the sky blue? Answer in one sentence.")),
        ("chat_code", chatml("Write a Rust function that returns the n-th Fibonacci number.")),
        ("chat_math", chatml("What is 17 * 23?", system="Be brief.")),
        ("chat_multiturn", chatml("My name is Ada.") + "Nice to meet you, Ada!<|im_end|>\n"
         "<|im_start|>user\nWhat is my name?<|im_end|>\n<|im_start|>assistant\n"),
        ("single_token", "Hello"),
        ("plain_fox", "The quick brown fox jumps over the lazy"),
        ("plain_story", "Once upon a time, in a small village at the edge of a great forest, "
         "there lived an old woodcutter and his daughter. Every morning, they"),
        ("plain_facts", "The Eiffel Tower is located in Paris. It was completed in 1889 and is"),
        ("plain_unicode", "Café, naïve, 日本語, and 😀 are all examples of"),
        ("code_rust", RUST),
        ("code_python", PYTHON),
    ]
    ex = sharegpt_excerpts(tok)
    p += [(f"sharegpt_{cid}", text) for cid, text in ex]
    p.append(("chat_sharegpt", chatml(ex[0][1])))
    return p


def run(key):
    path = MODELS / TARGETS[key]
    tok = load_tokenizer(path)
    items = [(name, text, tok.encode(text, add_special_tokens=False)) for name, text in prompts(tok)]
    t0 = time.time()
    m = Model(path, np.float32)
    print(f"{key}: loaded in {time.time() - t0:.1f}s, vocab {m.vocab}")
    t0 = time.time()
    logits = [m.forward(ids)[0] for _, _, ids in items]
    t32 = time.time() - t0
    del m
    gc.collect()
    m = Model(path, np.float64)
    t0 = time.time()
    diffs = [float(np.abs(m.forward(ids)[0] - l).max()) for (_, _, ids), l in zip(items, logits)]
    t64 = time.time() - t0
    vocab = m.vocab
    del m
    gc.collect()
    rows = []
    for i, ((name, text, ids), l, d) in enumerate(zip(items, logits, diffs)):
        top5 = np.argsort(-l, kind="stable")[:5]
        rows.append({"name": name, "text": text, "ids": ids, "top1": int(top5[0]),
                     "top5": [int(t) for t in top5], "top5_logits": [float(l[t]) for t in top5],
                     "offset": i, "f64_max_abs_diff": d})
        print(f"  {name:28} {len(ids):4} ids  top1 {int(top5[0]):6} "
              f"{tok.decode([int(top5[0])])!r:14} logit {l[top5[0]]:7.3f}  f64 diff {d:.2e}")
    out = {
        "model": TARGETS[key], "vocab": vocab, "numpy": np.__version__,
        "gguf": version("gguf"),
        "transformers": transformers.__version__,
        "note": "scripts/ref/numpy_llm.py: every GGUF tensor dequantized to float32 with "
                "gguf.quants.dequantize, float32 activations, no activation quantization "
                "(llama.cpp quantizes activations to q8 for quantized matmuls), exact softmax; "
                "logits of the last position only. .f16 holds each prompt's full logit vector "
                "as little-endian float16 at byte offset offset*vocab*2.",
        "f64_max_abs_diff": max(diffs),
        "prompts": rows,
    }
    dest = ROOT / "tests" / "fixtures" / f"logits_{key}"
    dest.with_suffix(".json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    dest.with_suffix(".f16").write_bytes(b"".join(l.astype("<f2").tobytes() for l in logits))
    print(f"  wrote {dest.relative_to(ROOT)}.json/.f16 ({len(rows)} prompts, "
          f"{sum(len(r['ids']) for r in rows)} tokens; f32 {t32:.1f}s, f64 {t64:.1f}s)")


if __name__ == "__main__":
    for key in sys.argv[1:] or list(TARGETS):
        run(key)
