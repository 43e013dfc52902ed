"""Read the harness's runs under OUT/runs, print the table, write OUT/lm_eval.json, and check
what must hold: the run with the cloud prompt scores every sample exactly as the run without
it, and the edge really ran the preamble's prompts on the cloud's KV.

    python compare.py OUT --model qwen05 [--small]
"""
import argparse
import glob
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

METRICS = {
    "ep_arith_mc": ("acc,none", "acc"),
    "ep_arith_gen": ("exact_match,strip", "exact match"),
    "ep_sharegpt_ppl": ("word_perplexity,none", "word perplexity"),
}


def machine():
    cpu, flags = platform.processor() or "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu in ("?", ""):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = [f for f in ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "asimd", "asimddp", "i8mm"] if f in flags]
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "simd": simd, "cores": len(glob.glob("/sys/devices/system/cpu/cpu[0-9]*")), "git_rev": rev}


def run(dir_):
    """{task: {"scores": {metric: value}, "samples": {doc_id: resps}}} of one harness run."""
    out = {}
    results = sorted(glob.glob(f"{dir_}/**/results_*.json", recursive=True))
    if not results:
        return out
    r = json.load(open(results[-1]))
    for task, scores in r["results"].items():
        out[task] = {"scores": {k: v for k, v in scores.items() if isinstance(v, (int, float))}, "samples": {}}
    for f in glob.glob(f"{dir_}/**/samples_*.jsonl", recursive=True):
        task = re.match(r"samples_(.+)_\d{4}-", Path(f).name)
        if not task or task.group(1) not in out:
            continue
        for line in open(f):
            s = json.loads(line)
            out[task.group(1)]["samples"][s["doc_id"]] = s["resps"]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", required=True)
    p.add_argument("--small", action="store_true")
    a = p.parse_args()
    out = Path(a.out)
    runs = {Path(d).name: run(d) for d in sorted(glob.glob(f"{out}/runs/*/"))}
    items = sum(1 for _ in open(out / "tasks/arith.jsonl"))
    failures = []

    # The cloud prompt changes nothing: every sample's responses equal, bit for bit.
    equal = {}
    for task in METRICS:
        a_, b_ = runs.get("ours", {}).get(task), runs.get("ours-cloud", {}).get(task)
        if not a_ or not b_:
            failures.append(f"{task}: missing from ours or ours-cloud")
            continue
        same = sum(1 for k, v in a_["samples"].items() if b_["samples"].get(k) == v)
        equal[task] = {"samples": len(a_["samples"]), "equal": same}
        if same != len(a_["samples"]) or not a_["samples"]:
            failures.append(f"{task}: {same} of {len(a_['samples'])} samples equal with the cloud prompt")
    matches = 0
    m = re.search(r"(\d+(\.\d+)?)\s*$", (out / "prefix_matches.txt").read_text() if (out / "prefix_matches.txt").exists() else "")
    if m:
        matches = int(float(m.group(1)))
    # Every choice of every multiple-choice item, and every generation, after the preamble.
    want = items * 4 + items
    if matches < want:
        failures.append(f"the edge ran {matches} prompts on the preamble's KV, {want} expected")

    def score(name, task):
        key = METRICS[task][0]
        return runs.get(name, {}).get(task, {}).get("scores", {}).get(key)

    names = [n for n in ["ours", "ours-cloud", "ours-text", "ours-chat", "ours-gguf", "llama-server-text",
                         "llama-server-chat"] if n in runs]
    table = {n: {t: score(n, t) for t in METRICS if score(n, t) is not None} for n in names}
    # llama.cpp's own scores of the requests the harness sent us (llama_scores.py).
    lc = out / "runs/llama-cpp/scores.json"
    llama = json.loads(lc.read_text()) if lc.exists() else {}
    if llama:
        names.append("llama.cpp (in process)")
        table["llama.cpp (in process)"] = {
            t: v[METRICS[t][0].split(",")[0]] for t, v in llama.items() if t in METRICS}
    echo = None
    if (out / "llama-server-echo.json").exists():
        # What llama-server made of the harness's loglikelihood request (echo + logprobs).
        raw = (out / "llama-server-echo.json").read_text()
        try:
            v = json.loads(raw)
            if "error" in v:
                echo = "refused: " + str(v["error"].get("message"))
            else:
                lp = v["choices"][0].get("logprobs") or {}
                got = len(lp.get("content") or lp.get("token_logprobs") or [])
                echo = (f"echo ignored: log-probabilities for {got} token(s), none of the prompt's "
                        f"{v['usage']['prompt_tokens']}, and the prompt not echoed "
                        f"(text {v['choices'][0]['text']!r})")
        except (ValueError, KeyError, IndexError, TypeError):
            echo = raw[:200]
    # Points between our server and llama.cpp's on the same client and task.
    pairs = [("ours-text", "llama-server-text", "ep_arith_gen"), ("ours-chat", "llama-server-chat", "ep_arith_gen"),
             ("ours", "llama.cpp (in process)", "ep_arith_mc")]
    gaps = []
    for ours, theirs, task in pairs:
        x, y = table.get(ours, {}).get(task), table.get(theirs, {}).get(task)
        if x is not None and y is not None:
            gaps.append({"ours": ours, "baseline": theirs, "task": task, "ours_score": x, "baseline_score": y,
                         "points": round(100 * (x - y), 2), "within_half_point": abs(100 * (x - y)) <= 0.5})
    doc = {
        "machine": machine(), "model": a.model, "harness": "lm_eval 0.4.13", "items": items,
        "documents": sum(1 for _ in open(out / "tasks/sharegpt.jsonl")), "scores": table,
        "equal_with_cloud_prompt": equal, "prompts_on_cloud_kv": matches, "vs_llama_cpp": gaps,
        "llama_server_echo": echo, "small": a.small, "llama_cpp_loglikelihoods": llama,
    }
    (out / "lm_eval.json").write_text(json.dumps(doc, indent=2) + "\n")

    print(f"machine: {doc['machine']['cpu']} ({'/'.join(doc['machine']['simd'])}, {doc['machine']['cores']} cores); "
          f"model {a.model}; {items} items, {doc['documents']} documents")
    print("| run | " + " | ".join(f"{t} ({METRICS[t][1]})" for t in METRICS) + " |")
    print("| --- | " + " | ".join("---" for _ in METRICS) + " |")
    for n in names:
        cells = [("%.4f" % table[n][t]) if t in table[n] else "-" for t in METRICS]
        print(f"| {n} | " + " | ".join(cells) + " |")
    for t, e in equal.items():
        print(f"with the cloud prompt: {t}: {e['equal']} of {e['samples']} samples equal")
    print(f"prompts run on the preamble's cloud KV: {matches} (of {want} that begin with it)")
    for g in gaps:
        print(f"{g['ours']} vs {g['baseline']} on {g['task']}: {g['points']:+.2f} points")
    if "ep_arith_mc" in llama:
        m = llama["ep_arith_mc"]
        print(f"loglikelihoods, ours vs llama.cpp: mean |diff| {m['mean_abs_diff']:.3f} nats, max {m['max_abs_diff']:.3f}")
    if "ep_sharegpt_ppl" in llama:
        x, y = table.get("ours", {}).get("ep_sharegpt_ppl"), llama["ep_sharegpt_ppl"]["word_perplexity"]
        if x:
            print(f"word perplexity, ours vs llama.cpp: {x:.2f} vs {y:.2f} ({100 * (x - y) / y:+.2f} %); "
                  f"per document at most {100 * llama['ep_sharegpt_ppl']['max_rel_diff']:.1f} % apart")
    if echo:
        print(f"llama-server on the harness's loglikelihood request: {echo}")
    for f in failures:
        print("FAILED: " + f, file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
