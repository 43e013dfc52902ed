#!/usr/bin/env python3
"""Reference tokenizations of Gemma 3 from llama.cpp's own SentencePiece tokenizer (through the
pinned llama-cpp-python, vocab only): an implementation independent of the engine's.

Writes tests/fixtures/tokenizer_gemma3.json in the format of tokenizer_fixture.py: raw encodings
(no BOS added, special tokens in the text matched), plus decode checks.
Usage: .venv-bench/bin/python scripts/ref/tokenizer_llamacpp.py
(needs models/: scripts/models.py gemma3 sharegpt; .venv-bench: scripts/bench_engine.sh sets it up)
"""
import json
from pathlib import Path

import llama_cpp

from strings import COMMON, sharegpt_snippets

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
# Gemma's own markers, its whitespace/newline pieces, and the byte-fallback path (characters
# outside the 262k vocabulary: private-use, rare CJK extension, control bytes).
GEMMA = [
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>", "a\n\n\n\nb", "x" + " " * 31 + "y", "\u0001\u0002 control \u007f",
    "\ue000\uf8ff private use", "\U00020000\U0002a6d6 ext-B", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙", "�",
    "trailing newline\n", " leading space",
]


def main():
    m = llama_cpp.Llama(str(MODEL), vocab_only=True, verbose=False)
    texts = COMMON + GEMMA + sharegpt_snippets(6)
    cases = [{"text": t, "ids": m.tokenize(t.encode(), add_bos=False, special=True)}
             for t in texts]
    checks = [c["ids"] for c in cases[1:]][::7]
    out = {
        "model": MODEL.name, "bos_id": m.token_bos(), "eos_id": m.token_eos(),
        "llama_cpp_python": llama_cpp.__version__,
        "note": "llama.cpp tokenize(add_bos=False, special=True); decode = detokenize "
                "(special tokens rendered)",
        "cases": cases,
        "decode_checks": [{"ids": ids, "text": m.detokenize(ids, special=True).decode()}
                          for ids in checks],
    }
    dest = ROOT / "tests" / "fixtures" / "tokenizer_gemma3.json"
    dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{dest.relative_to(ROOT)}: {len(cases)} cases, "
          f"{sum(len(c['ids']) for c in cases)} ids, bos={out['bos_id']} eos={out['eos_id']}")


if __name__ == "__main__":
    main()
