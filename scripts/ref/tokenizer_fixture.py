#!/usr/bin/env python3
"""Reference tokenizations from an independent tokenizer: transformers' GGUF tokenizer
(AutoTokenizer.from_pretrained(dir, gguf_file=NAME)), built from the GGUF's own vocab/merges.

Writes tests/fixtures/tokenizer_smollm2.json and tests/fixtures/tokenizer_qwen05.json:
  {"model", "bos_id", "eos_id", "transformers", "tokenizers", "pre_tokenizer", "note",
   "cases": [{"text", "ids"[, "ids_unpatched"]}], "decode_checks": [{"ids", "text"}]}
ids are raw encodings: add_special_tokens=False (no BOS), special tokens in the text are matched.

One patch (see load_tokenizer): transformers has no split rule for tokenizer.ggml.pre = "smollm",
so it falls back to plain GPT-2 byte-level splitting. SmolLM2's own tokenizer (and llama.cpp's
"smollm" pre-tokenizer) first isolates every digit (\\p{N}), then applies the GPT-2 regex; this
changes e.g. "x  1" (GPT-2: x,Ġ,Ġ,1; smollm: x,ĠĠ,1). We set that pre-tokenizer; cases where the
unpatched transformers result differs keep it as "ids_unpatched".

Usage: python3 scripts/ref/tokenizer_fixture.py   (needs models/: scripts/models.py smollm2 qwen05 sharegpt)
Packages (scripts/ref/requirements.txt): transformers 5.23.0, tokenizers 0.23.3, gguf 0.19.0,
numpy 2.4.6, torch 2.15.0 (transformers' GGUF reader imports torch), sentencepiece, protobuf.
"""
import json
from pathlib import Path

import tokenizers
import transformers
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer

from strings import COMMON, sharegpt_snippets

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
TARGETS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
           "qwen05": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}


def gguf_pre(path):
    from gguf import GGUFReader
    return GGUFReader(str(path)).fields["tokenizer.ggml.pre"].contents()


def load_tokenizer(path, patch=True):
    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if patch and gguf_pre(path) == "smollm":
        tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return tok


SPECIAL = {
    "smollm2": ["<|endoftext|>", "<|im_start|>assistant\nSure!<|im_end|>\n<|endoftext|>",
                "<repo_name>x<file_sep>y.py\n<filename>z"],
    "qwen05": ["<|endoftext|>", "<|im_start|>system\nBe brief.<|im_end|>\n<|endoftext|>",
               "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<tool_call>{}</tool_call>"],
}


def main():
    snippets = sharegpt_snippets()
    for key, name in TARGETS.items():
        path = MODELS / name
        tok, raw = load_tokenizer(path), load_tokenizer(path, patch=False)
        cases, n_diff = [], 0
        for text in COMMON + SPECIAL[key] + snippets:
            ids = tok.encode(text, add_special_tokens=False)
            case = {"text": text, "ids": ids}
            ids_raw = raw.encode(text, add_special_tokens=False)
            if ids_raw != ids:
                case["ids_unpatched"], n_diff = ids_raw, n_diff + 1
            cases.append(case)
        checks = [c["ids"] for c in cases[1:]][::7] + [[tok.bos_token_id, tok.eos_token_id]]
        out = {
            "model": name, "bos_id": tok.bos_token_id, "eos_id": tok.eos_token_id,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "pre_tokenizer": gguf_pre(path),
            "note": "transformers GGUF tokenizer, add_special_tokens=False; for pre=smollm the "
                    "pre-tokenizer is set to Digits(individual)+ByteLevel(GPT-2 regex), as "
                    "SmolLM2/llama.cpp do (ids_unpatched: transformers' default where it differs)",
            "cases": cases,
            "decode_checks": [{"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)}
                              for ids in checks],
        }
        dest = ROOT / "tests" / "fixtures" / f"tokenizer_{key}.json"
        dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        roundtrip = sum(tok.decode(c["ids"], skip_special_tokens=False) == c["text"] for c in cases)
        print(f"{dest.relative_to(ROOT)}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)}"
              f" ids, bos={out['bos_id']} eos={out['eos_id']}, pre={out['pre_tokenizer']}, "
              f"decode round-trips {roundtrip}/{len(cases)}, unpatched differs on {n_diff}")
        for c in cases[:: max(1, len(cases) // 8)]:
            print(f"   {c['text'][:40]!r:46} -> {c['ids'][:12]}")


if __name__ == "__main__":
    main()
