"""The lm-evaluation-harness tasks the project runs, made from local data (the harness cannot
download datasets here): two-digit addition as multiple choice (loglikelihood) and as generation
(generate_until), each after a fixed 8-example few-shot preamble, and ShareGPT messages for
perplexity (loglikelihood_rolling). Writes the data, the task YAMLs, the preamble and a cloud
prompts file whose prompt is that preamble.

    python make_tasks.py OUT_DIR --items 100 --docs 30 --sharegpt models/ShareGPT_...json
"""
import argparse
import json
import random
from pathlib import Path

FEWSHOT = 8


def problem(rng):
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    right = a + b
    wrong = set()
    while len(wrong) < 3:
        w = right + rng.choice([-11, -10, -9, -2, -1, 1, 2, 9, 10, 11])
        if w != right and w > 0:
            wrong.add(w)
    choices = [str(c) for c in [right, *sorted(wrong)]]
    rng.shuffle(choices)
    return {"a": a, "b": b, "answer": str(right), "choices": choices, "label": choices.index(str(right))}


def question(d):
    return f"Question: What is {d['a']} + {d['b']}?\nAnswer:"


def sharegpt_docs(path, n, rng):
    """The first `n` human messages of 300-1500 characters, read record by record (the
    packaged file is cut short)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")[: 8 << 20]
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while len(out) < n:
        while text[i] in " \n\r\t,":
            i += 1
        rec, i = dec.raw_decode(text, i)
        for turn in rec.get("conversations", []):
            v = turn.get("value", "")
            if turn.get("from") == "human" and 300 <= len(v) <= 1500 and v.isascii():
                out.append({"text": v})
                break
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--docs", type=int, default=30)
    p.add_argument("--sharegpt", required=True)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(a.seed)
    shots = [problem(rng) for _ in range(FEWSHOT)]
    items = [problem(rng) for _ in range(a.items)]
    docs = sharegpt_docs(a.sharegpt, a.docs, rng)

    def write(name, rows):
        (out / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("arith_fewshot.jsonl", shots)
    write("arith.jsonl", items)
    write("sharegpt.jsonl", docs)
    # What the harness puts before every question: the examples, each answered, joined by a
    # blank line. It ends on a digit, so the question's "\n\n" starts a new token in any BPE.
    preamble = "\n\n".join(f"{question(d)} {d['answer']}" for d in shots)
    (out / "preamble.txt").write_text(preamble)
    (out / "prompts.toml").write_text(
        "# The few-shot preamble of the arith tasks, as a cloud prompt (plain text).\n"
        f"[[prompt]]\nid = \"arith-fewshot\"\ntext = {json.dumps(preamble)}\n"
    )
    data = lambda f: f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {out / f}\n"
    fewshot = (
        f"    fewshot: {out / 'arith_fewshot.jsonl'}\n"
        "fewshot_split: fewshot\nnum_fewshot: 8\nfewshot_config:\n  sampler: first_n\n"
    )
    arith = (
        "dataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {out / 'arith.jsonl'}\n" + fewshot + "test_split: test\n"
        "doc_to_text: \"Question: What is {{a}} + {{b}}?\\nAnswer:\"\n"
    )
    (out / "ep_arith_mc.yaml").write_text(
        "task: ep_arith_mc\n" + arith + "output_type: multiple_choice\n"
        "doc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (out / "ep_arith_gen.yaml").write_text(
        "task: ep_arith_gen\n" + arith + "output_type: generate_until\n"
        "doc_to_target: answer\n"
        "generation_kwargs:\n  until: [\"\\n\"]\n  max_gen_toks: 8\n  do_sample: false\n  temperature: 0\n"
        "filter_list:\n  - name: strip\n    filter:\n      - function: regex\n"
        "        regex_pattern: \"(\\\\d+)\"\n      - function: take_first\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    (out / "ep_sharegpt_ppl.yaml").write_text(
        "task: ep_sharegpt_ppl\n" + data("sharegpt.jsonl") + "test_split: test\n"
        "output_type: loglikelihood_rolling\ndoc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    print(json.dumps({"out": str(out), "items": len(items), "docs": len(docs), "preamble_chars": len(preamble)}))


if __name__ == "__main__":
    main()
