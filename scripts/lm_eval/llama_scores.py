"""llama.cpp's own log-likelihoods for the requests the harness sent our server: each
multiple-choice context and continuation, and each perplexity document after the harness's
prefix token, scored by llama-cpp-python on the same GGUF (all logits, a plain log-softmax
here). llama.cpp's servers cannot stand in: llama-server ignores `echo` (no prompt
log-probabilities), and llama-cpp-python's server takes ~40 s a request computing them in
Python. Writes OUT/runs/llama-cpp/scores.json.

    .venv-bench/bin/python llama_scores.py OUT GGUF [TASK ...]   (default: both tasks)
"""
import glob
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama


def samples(out, task):
    f = sorted(glob.glob(f"{out}/runs/ours/**/samples_{task}_*.jsonl", recursive=True))[-1]
    return [json.loads(line) for line in open(f)]


def main():
    out, gguf = Path(sys.argv[1]), sys.argv[2]
    tasks = sys.argv[3:] or ["ep_arith_mc", "ep_sharegpt_ppl"]
    path = out / "runs/llama-cpp/scores.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    llm = Llama(model_path=gguf, n_ctx=1024, n_batch=512, n_threads=2, logits_all=True, verbose=False)
    tok = lambda s: llm.tokenize(s.encode(), add_bos=False, special=False)

    def score(ctx, cont):
        """Sum of the continuation's log-probabilities after the context, and whether each
        of its tokens was the argmax."""
        llm.reset()
        llm.eval(ctx + cont)
        total, greedy = 0.0, True
        for j, t in enumerate(cont):
            row = np.asarray(llm.scores[len(ctx) - 1 + j], dtype=np.float64)
            m = row.max()
            lse = m + math.log(np.exp(row - m).sum())
            total += row[t] - lse
            greedy &= int(row.argmax()) == t
        return total, greedy

    mc = samples(out, "ep_arith_mc") if "ep_arith_mc" in tasks else []
    correct, diffs = 0, []
    for s in mc:
        lls = []
        for k in range(len(s["doc"]["choices"])):
            a = s["arguments"][f"gen_args_{k}"]
            ll, _ = score(tok(a["arg_0"]), tok(a["arg_1"]))
            lls.append(ll)
            diffs.append(abs(ll - float(s["resps"][k][0][0])))
        correct += int(np.argmax(lls)) == s["doc"]["label"]
        print(f"\rmultiple choice: {s['doc_id'] + 1}/{len(mc)}", end="", file=sys.stderr)
    if mc:
        print(file=sys.stderr)
        result["ep_arith_mc"] = {"acc": correct / len(mc), "max_abs_diff": max(diffs),
                                 "mean_abs_diff": sum(diffs) / len(diffs)}

    ppl = samples(out, "ep_sharegpt_ppl") if "ep_sharegpt_ppl" in tasks else []
    # The harness's remote-tokenizer models put BOS (else EOS) before each document.
    prefix = llm.token_bos() if llm.token_bos() >= 0 else llm.token_eos()
    total, words, diffs = 0.0, 0, []
    for s in ppl:
        text = s["doc"]["text"]
        ll, _ = score([prefix], tok(text))
        ours = float(s["resps"][0][0])
        diffs.append(abs(ll - ours) / max(1.0, abs(ours)))
        total += ll
        words += len(re.split(r"\s+", text))
    if ppl:
        result["ep_sharegpt_ppl"] = {"word_perplexity": math.exp(-total / words), "max_rel_diff": max(diffs)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
