#!/usr/bin/env python3
"""llama.cpp's own logits and tokenizations on the synthetic GGUFs of synth.py: the reference the
engine's new architectures are held to (tests/fixtures/synth/<arch>.json and .f16).

For each architecture: the GGUF written by synth.py (its SHA-256 recorded, so a test knows it
runs the very file llama.cpp ran), three prompts tokenized by llama.cpp, evaluated in process by
the pinned llama-cpp-python (llama.cpp 0c1e570, 2 threads, f16 KV cache), and the logits of
two positions of each prompt (the middle and the last) and of three greedy decode steps after
the last prompt, kept in full as float16; plus llama.cpp's tokenization of the strings fixture
under the architecture's pre-tokenizer.

    .venv-bench/bin/python scripts/ref/synth_logits.py [ARCH ...]

(.venv-bench: scripts/llama_venv.sh builds it; it also needs numpy and gguf.)
"""
import json
import sys
from pathlib import Path

import numpy as np
import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import synth  # noqa: E402
from strings import COMMON  # noqa: E402

ROOT = synth.ROOT
OUT = ROOT / "tests" / "fixtures" / "synth"
PROMPTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs back home to sleep.",
    "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n",
    "Refunds are possible up to 24 hours before departure; after that a 20% fee applies.",
]
DECODE = 3


def reference(name: str, path: Path) -> dict:
    llm = llama_cpp.Llama(
        str(path), n_ctx=512, n_batch=512, logits_all=True, n_threads=2, seed=0, verbose=False,
        n_gpu_layers=0,
    )
    vocab = llm.n_vocab()
    toks = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=False, special=True)} for t in COMMON]
    if synth.ARCHS[name].get("tokenizer_only"):
        # A prompt as llama.cpp starts one: BOS or not, as the file (or its default) says.
        text = PROMPTS[0]
        prompt = {"text": text, "ids": llm.tokenize(text.encode(), add_bos=True, special=False)}
        return {"vocab": vocab, "logits": [], "tokenizer": toks, "prompt": prompt}
    rows, records = [], []
    for pi, text in enumerate(PROMPTS):
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
        keep = [len(ids) // 2, len(ids) - 1]
        for p in keep:
            rows.append(scores[p])
            records.append({"prompt": pi, "position": p, "ids": ids[: p + 1]})
        if pi == len(PROMPTS) - 1:
            seq = list(ids)
            last = scores[-1]
            for _ in range(DECODE):
                tok = int(np.argmax(last))
                seq.append(tok)
                llm.eval([tok])
                last = np.array(llm.scores[len(seq) - 1], dtype=np.float32)
                rows.append(last)
                records.append({"prompt": pi, "position": len(seq) - 1, "ids": list(seq)})
    for r, row in zip(records, rows):
        top = np.argsort(-row)[:2]
        r["top1"] = int(top[0])
        r["top2_gap"] = float(row[top[0]] - row[top[1]])
    (OUT / f"{name}.f16").write_bytes(np.stack(rows).astype(np.float16).tobytes())
    return {"vocab": vocab, "logits": records, "tokenizer": toks}


def main():
    names = sys.argv[1:] or list(synth.ARCHS)
    OUT.mkdir(parents=True, exist_ok=True)
    models = ROOT / "models" / "synth"
    models.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = synth.write(name, synth.ARCHS[name], models)
        ref = reference(name, path)
        out = {
            "arch": name,
            "gguf": path.name,
            "sha256": synth.sha256(path),
            "llama_cpp_python": llama_cpp.__version__,
            "note": "llama.cpp in process, 2 threads; logits rows in <arch>.f16 in this order",
            **ref,
        }
        (OUT / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {len(ref['logits'])} logit rows of {ref['vocab']}, "
              f"{len(ref['tokenizer'])} tokenizer cases, sha256 {out['sha256'][:16]}")


if __name__ == "__main__":
    main()
