#!/usr/bin/env python3
"""Train the CE-LSLM KV fuser: per small-model layer, a gated correction to the small model's
own prompt KV computed from the large model's KV of the same prompt (both models frozen).

    python3 scripts/fuser/train.py            # reads models/fuser/data, writes models/fuser/

Data: `edgeprompt fuser-data` (both models' prompt KV from the engine, the large model's top-k
next-token distribution per answer token). Loss on each case's answer tokens: cross-entropy
(weight --alpha) plus KL from the large model's top-k distribution (1 - alpha). The last --val
cases (by record) are never trained on; the learning curve on them goes to train.jsonl.

The fuser, per layer j (matched large-model layer i), for keys (RoPE undone) and values alike:
    x = [rmsnorm(K_llm[i]), rmsnorm(K_slm[j])]          per token
    d = W2 silu(W1 x + b1) + b2                          (hidden --hidden)
    K'[j] = K_slm[j] + gate[head] * rms(K_slm[j]) * d    (then RoPE at the token's position)
gates start at 0: the untrained fuser is exactly the small model alone. The cloud applies the
same arithmetic (crates/align/src/fuser.rs) and rounds the result to f16, as here.
"""
import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen import Qwen2  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EPS = 1e-6


def rmsnorm(x):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def rms(x):
    return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


class Part(torch.nn.Module):
    """One fuser for keys or values of one layer."""

    def __init__(self, d_llm, d_slm, hidden, n_kv_head):
        super().__init__()
        self.w1 = torch.nn.Linear(d_llm + d_slm, hidden)
        self.w2 = torch.nn.Linear(hidden, d_slm)
        self.gate = torch.nn.Parameter(torch.zeros(n_kv_head))
        self.n_kv_head = n_kv_head

    def correction(self, llm, slm):
        x = torch.cat([rmsnorm(llm), rmsnorm(slm)], -1)
        d = self.w2(torch.nn.functional.silu(self.w1(x))) * rms(slm)
        n, w = d.shape
        return (d.view(n, self.n_kv_head, -1) * self.gate[None, :, None]).view(n, w)


class Fuser(torch.nn.Module):
    def __init__(self, matches, d_llm, d_slm, hidden, n_kv_head):
        super().__init__()
        self.matches = matches
        self.k = torch.nn.ModuleList([Part(d_llm, d_slm, hidden, n_kv_head) for _ in matches])
        self.v = torch.nn.ModuleList([Part(d_llm, d_slm, hidden, n_kv_head) for _ in matches])

    def tensors(self):
        out = {}
        for j in range(len(self.matches)):
            for name, part in (("k", self.k[j]), ("v", self.v[j])):
                p = f"fuser.{j}.{name}."
                out[p + "w1"] = part.w1.weight.detach().contiguous()
                out[p + "b1"] = part.w1.bias.detach().contiguous()
                out[p + "w2"] = part.w2.weight.detach().contiguous()
                out[p + "b2"] = part.w2.bias.detach().contiguous()
                out[p + "gate"] = part.gate.detach().contiguous()
        return out


def f16_round(x):
    """The KV the edge holds is f16: train on what it will see (straight-through gradient)."""
    return x + (x.half().float() - x).detach()


class Case:
    def __init__(self, path):
        self.path = path
        with safe_open(str(path), "pt") as f:
            self.meta = f.metadata()
            self.answer = f.get_tensor("answer").long()

    def load(self, slm_layers, llm_layers):
        d = {}
        with safe_open(str(self.path), "pt") as f:
            for name in ("cloud", "private", "answer", "llm.top_ids"):
                d[name] = f.get_tensor(name).long()
            for name in ("llm.top_logp", "slm.nll", "llm.nll"):
                d[name] = f.get_tensor(name)
            for j in range(slm_layers):
                d[f"slm.{j}.k"] = f.get_tensor(f"slm.{j}.k").float()
                d[f"slm.{j}.v"] = f.get_tensor(f"slm.{j}.v").float()
            for i in set(llm_layers):
                d[f"llm.{i}.k"] = f.get_tensor(f"llm.{i}.k").float()
                d[f"llm.{i}.v"] = f.get_tensor(f"llm.{i}.v").float()
        return d


def fused_past(model, fuser, d):
    """The prompt KV the cloud serves: per layer (K rotated, V), corrected by the fuser."""
    n = len(d["cloud"])
    pos = torch.arange(n)
    nkv, hd = model.n_kv_head, model.head_dim
    past = []
    for j in range(model.n_layer):
        k_rot, v = d[f"slm.{j}.k"], d[f"slm.{j}.v"]
        if fuser is None:
            past.append((k_rot, v))
            continue
        i = fuser.matches[j]
        k_un = model.rope.unapply(k_rot.view(n, nkv, hd), pos).view(n, -1)
        ck = fuser.k[j].correction(d[f"llm.{i}.k"], k_un)
        ck = model.rope.apply(ck.view(n, nkv, hd), pos).view(n, -1)
        cv = fuser.v[j].correction(d[f"llm.{i}.v"], v)
        past.append((f16_round(k_rot + ck), f16_round(v + cv)))
    return past


def losses(model, fuser, d, alpha):
    past = fused_past(model, fuser, d)
    full = torch.cat([d["private"], d["answer"]])
    logits = model.forward(full[:-1], past, len(d["cloud"]), len(d["private"]) - 1)
    logq = torch.log_softmax(logits, -1)
    ce = -logq.gather(1, d["answer"][:, None])[:, 0]
    p = torch.softmax(d["llm.top_logp"], -1)  # the teacher's top-k, renormalized
    kl = (p * (torch.log(p + 1e-12) - logq.gather(1, d["llm.top_ids"]))).sum(-1)
    loss = alpha * ce.mean() + (1 - alpha) * kl.mean()
    agree = (logits.argmax(-1) == d["llm.top_ids"][:, 0]).float()
    return loss, ce.detach(), agree


def evaluate(model, fuser, cases, slm_layers, llm_layers, alpha):
    nll, agree, per_case = [], [], []
    with torch.no_grad():
        for c in cases:
            d = c.load(slm_layers, llm_layers)
            _, ce, ag = losses(model, fuser, d, alpha)
            nll.append(ce)
            agree.append(ag)
            per_case.append(ce.mean().item())
    nll, agree = torch.cat(nll), torch.cat(agree)
    return {"ppl": math.exp(nll.mean().item()), "agree_llm": agree.mean().item(),
            "per_case_nll": per_case}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=ROOT / "models/fuser/data", type=Path)
    ap.add_argument("--slm", default=ROOT / "models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", type=Path)
    ap.add_argument("--out", default=ROOT / "models/fuser", type=Path)
    ap.add_argument("--llm-layers", type=int, default=28, help="the large model's layer count")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--steps", type=int, default=400,
                    help="optimizer steps the learning-rate schedule spans")
    ap.add_argument("--stop-after", type=int, default=200,
                    help="steps actually taken (the checkpoint of a longer schedule)")
    ap.add_argument("--accum", type=int, default=2, help="cases per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--gate-lr", type=float, default=1e-3,
                    help="learning rate of the per-head gates (they start at 0)")
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--alpha", type=float, default=0.5, help="weight of cross-entropy vs KL")
    ap.add_argument("--val", type=int, default=24, help="cases held apart for the curve")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    rng = random.Random(a.seed)
    files = sorted(a.data.glob("case-*.safetensors"))
    if len(files) <= a.val:
        sys.exit(f"{a.data}: {len(files)} cases, need more than --val {a.val}")
    cases = [Case(p) for p in files]
    fps = {(c.meta["llm_fingerprint"], c.meta["slm_fingerprint"]) for c in cases}
    if len(fps) != 1:
        sys.exit("the data comes from more than one model pair")
    llm_fp, slm_fp = fps.pop()
    train, val = cases[: -a.val], cases[-a.val:]
    t0 = time.time()
    model = Qwen2(a.slm)
    for w in model.w.values():
        w.requires_grad_(False)
    print(f"SLM loaded in {time.time() - t0:.0f} s; {len(train)} training cases, {len(val)} held apart",
          flush=True)
    L, S = a.llm_layers, model.n_layer
    matches = [round(j * (L - 1) / (S - 1)) for j in range(S)]
    d0 = train[0].load(S, matches)
    d_llm, d_slm = d0[f"llm.{matches[0]}.k"].shape[1], d0["slm.0.k"].shape[1]
    fuser = Fuser(matches, d_llm, d_slm, a.hidden, model.n_kv_head)
    gates = [p for n, p in fuser.named_parameters() if n.endswith("gate")]
    rest = [p for n, p in fuser.named_parameters() if not n.endswith("gate")]
    opt = torch.optim.AdamW([{"params": rest, "lr": a.lr},
                             {"params": gates, "lr": a.gate_lr}],
                            weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps)))
    a.out.mkdir(parents=True, exist_ok=True)
    log = open(a.out / "train.jsonl", "w")

    def record(step, extra):
        ev = evaluate(model, fuser if step > 0 else None, val, S, matches, a.alpha)
        row = {"step": step, "secs": round(time.time() - t0, 1), "val_ppl": ev["ppl"],
               "val_agree_llm": ev["agree_llm"], **extra}
        print(json.dumps(row), flush=True)
        log.write(json.dumps({**row, "val_per_case_nll": ev["per_case_nll"]}) + "\n")
        log.flush()
        return ev

    # The script's forward pass against the engine's, before anything is trained.
    d = val[0].load(S, matches)
    with torch.no_grad():
        _, ce, _ = losses(model, None, d, a.alpha)
    gap = (ce - d["slm.nll"]).abs()
    print(f"check: this forward vs the engine's per-token loss on a held-apart case: "
          f"mean |diff| {gap.mean():.4f}, max {gap.max():.4f}", flush=True)
    base = record(0, {"train_loss": None})
    order, run_loss, run_n = [], 0.0, 0
    last = min(a.stop_after, a.steps)
    for step in range(1, last + 1):
        opt.zero_grad()
        for _ in range(a.accum):
            if not order:
                order = list(range(len(train)))
                rng.shuffle(order)
            d = train[order.pop()].load(S, matches)
            loss, _, _ = losses(model, fuser, d, a.alpha)
            (loss / a.accum).backward()
            run_loss, run_n = run_loss + loss.item(), run_n + 1
        torch.nn.utils.clip_grad_norm_(fuser.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 20 == 0:
            gates = torch.cat([p.gate.detach().abs() for p in list(fuser.k) + list(fuser.v)])
            print(f"step {step} loss {run_loss / run_n:.4f} |gate| mean {gates.mean():.3f} "
                  f"max {gates.max():.3f} ({time.time() - t0:.0f} s)", flush=True)
        if step % a.eval_every == 0 or step == last:
            record(step, {"train_loss": run_loss / max(run_n, 1)})
            run_loss, run_n = 0.0, 0
            save(a, fuser, model, llm_fp, slm_fp, L, d_llm, matches, step, len(train), base)
    log.close()


def save(a, fuser, model, llm_fp, slm_fp, n_llm, d_llm, matches, step, n_train, base):
    meta = {
        "llm_fingerprint": llm_fp,
        "slm_fingerprint": slm_fp,
        "llm_n_layer": n_llm,
        "llm_kv_width": d_llm,
        "slm": {"n_layer": model.n_layer, "n_kv_head": model.n_kv_head, "head_dim": model.head_dim},
        "slm_rope_base": model.rope_base,
        "matches": matches,
        "hidden": a.hidden,
        "training": {"steps": step, "schedule_steps": a.steps, "cases": n_train,
                     "accum": a.accum, "lr": a.lr, "weight_decay": a.weight_decay,
                     "gate_lr": a.gate_lr, "hidden": a.hidden,
                     "alpha": a.alpha, "seed": a.seed, "torch": torch.__version__,
                     "val_ppl_untrained": base["ppl"]},
    }
    path = a.out / "fuser.safetensors"
    tmp = path.with_suffix(".tmp")
    save_file(fuser.tensors(), str(tmp), metadata={"edgeprompt.fuser": json.dumps(meta)})
    tmp.replace(path)


if __name__ == "__main__":
    main()
