#!/usr/bin/env python3
"""Reference last-position logits for Gemma 3 270M from the independent numpy forward pass
(numpy_llm.py), token ids from llama.cpp's tokenizer (BOS first, as the model expects).

Writes tests/fixtures/logits_gemma3.{json,f16} in logits_fixture.py's format. Two prompts are
longer than the 512-token sliding window, so the window itself is checked. As a check of the
reference, llama.cpp's own logits for each prompt are compared too (printed, and the cosine
stored as "llama_cpp_cosine").
Usage: .venv-bench/bin/python scripts/ref/logits_gemma3.py
(needs numpy 2.4.6 + gguf 0.19.0 + llama-cpp-python 0.3.36 in that venv; models gemma3, sharegpt)
"""
import json
import time
from importlib.metadata import version

import llama_cpp
import numpy as np

from numpy_llm import Model
from split_pairs import records
from strings import SHAREGPT

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
SHORT = [
    ("single_token", ""),
    ("plain_fox", "The quick brown fox jumps over the lazy"),
    ("plain_story", "Once upon a time, in a small village at the edge of a great forest, "
     "there lived an old woodcutter and his daughter. Every morning, they"),
    ("plain_facts", "The Eiffel Tower is located in Paris. It was completed in 1889 and is"),
    ("plain_unicode", "Café, naïve, 日本語, and 😀 are all examples of"),
    ("code_rust", "/// Count words in `text`.\npub fn word_counts(text: &str) -> usize {\n"),
    ("code_python", "def fib(n):\n    if n < 2:\n        return n\n    return"),
    ("turns", "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
     "<start_of_turn>model\n"),
]


def long_texts(tok, want=(600, 900)):
    """ShareGPT conversations joined until they pass each length (tokens), cut there."""
    out, text = [], ""
    for r in records(SHAREGPT, limit=300)[20:]:
        for t in r.get("conversations", []):
            text += t["value"] + "\n\n"
        ids = tok(text)
        for n in want:
            if len(ids) >= n and len(out) < len(want) and n not in [x[0] for x in out]:
                out.append((n, ids[:n]))
        if len(out) == len(want):
            return out
    raise SystemExit("not enough ShareGPT text")


def main():
    lc = llama_cpp.Llama(str(MODEL), n_ctx=2048, n_batch=2048, n_ubatch=2048, verbose=False,
                         n_threads=2)
    tok = lambda s: lc.tokenize(s.encode(), add_bos=True, special=True)
    items = [(name, text, tok(text)) for name, text in SHORT]
    items += [(f"sharegpt_{n}", lc.detokenize(ids[1:]).decode(errors="replace"), ids)
              for n, ids in long_texts(tok)]
    t0 = time.time()
    m = Model(MODEL, np.float32)
    print(f"loaded in {time.time() - t0:.1f}s, vocab {m.vocab}")
    rows, logits = [], []
    for i, (name, text, ids) in enumerate(items):
        ref = m.forward(ids)[0]
        lc.reset()
        lc.eval(ids)
        last = llama_cpp.llama_get_logits_ith(lc._ctx.ctx, -1)
        cpp = np.ctypeslib.as_array(last, shape=(m.vocab,)).astype(np.float64)
        cos = float(ref @ cpp / (np.linalg.norm(ref) * np.linalg.norm(cpp)))
        top5 = np.argsort(-ref, kind="stable")[:5]
        logits.append(ref)
        rows.append({"name": name, "text": text, "ids": ids, "top1": int(top5[0]),
                     "top5": [int(t) for t in top5], "top5_logits": [float(ref[t]) for t in top5],
                     "offset": i, "llama_cpp_cosine": cos, "llama_cpp_top1": int(cpp.argmax())})
        print(f"  {name:16} {len(ids):4} ids  top1 {int(top5[0]):6} llama.cpp {int(cpp.argmax()):6}"
              f"  cosine vs llama.cpp {cos:.5f}")
    out = {
        "model": MODEL.name, "vocab": m.vocab, "numpy": np.__version__, "gguf": version("gguf"),
        "llama_cpp_python": llama_cpp.__version__,
        "note": "scripts/ref/numpy_llm.py (gemma3 branch): GGUF tensors dequantized to float32 "
                "with gguf.quants.dequantize, float32 activations, exact softmax and tanh GELU; "
                "ids from llama.cpp's tokenizer with BOS. .f16: each prompt's logits as "
                "little-endian float16 at byte offset offset*vocab*2.",
        "prompts": rows,
    }
    dest = ROOT / "tests" / "fixtures" / "logits_gemma3"
    dest.with_suffix(".json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    dest.with_suffix(".f16").write_bytes(b"".join(l.astype("<f2").tobytes() for l in logits))
    print(f"wrote {dest.relative_to(ROOT)}.json/.f16 ({len(rows)} prompts)")


if __name__ == "__main__":
    main()
