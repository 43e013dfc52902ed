#!/usr/bin/env python3
"""Independent plain-numpy forward pass for GGUF llama / qwen2 / gemma3 models (the reference the engine's
logits are tested against; shares no code with the Rust engine or with llama.cpp).

Weights: every tensor is read with gguf's GGUFReader and dequantized with gguf.quants.dequantize
to float32 (exact: each block's value is scale * q (+ min) as ggml defines it). Activations are
float32 by default (--f64: float64 everywhere, to measure the reference's own rounding noise).
No activation quantization (llama.cpp quantizes activations to q8 for its quantized matmuls; this
reference does not, so expect small differences from llama.cpp, not from the math).

Layout: GGUFReader's `tensor.shape` is in ggml order (ne0 = fastest = in_features first); the data
array is in numpy order, so dequantize(...) of `blk.N.attn_q.weight` is [out_features, in_features]
and y = x @ W.T.  RoPE: llama (whose Q/K the converter permuted) rotates adjacent pairs
(x[2i], x[2i+1]) -- ggml's "normal" mode; qwen2 rotates (x[i], x[i+d/2]) -- NEOX mode.
gemma3 (as Google's reference defines it): embeddings times sqrt(width); per-head RMS norms of
Q and K before NEOX RoPE; every 6th layer global (RoPE base from the file), the others a sliding
window of `sliding_window` positions (a query sees keys q - k < window) with RoPE base 10 000;
RMS norms after attention and after the FFN; GELU (tanh form) gate; the converter already
stored Gemma's (1 + weight) norm scales, so every norm here is x * w.

Usage (greedy sanity check, chat-formatted):
  python3 scripts/ref/numpy_llm.py models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --question "What is the capital of France?" --n 20 [--f64]
Packages: see scripts/ref/requirements.txt (gguf 0.19.0, numpy 2.4.6; the CLI's tokenizer needs
transformers 5.23.0 + torch, via tokenizer_fixture.load_tokenizer).
"""
import argparse
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


class Model:
    def __init__(self, path, dtype=np.float32):
        self.path, self.dtype = str(path), dtype
        r = GGUFReader(self.path)
        self.meta = {k: f.contents() for k, f in r.fields.items()
                     if not k.startswith("tokenizer.ggml.")}
        self.arch = a = self.meta["general.architecture"]
        assert a in ("llama", "qwen2", "gemma3"), f"unsupported arch {a}"
        self.n_layer = self.meta[f"{a}.block_count"]
        self.n_embd = self.meta[f"{a}.embedding_length"]
        self.n_head = self.meta[f"{a}.attention.head_count"]
        self.n_kv = self.meta[f"{a}.attention.head_count_kv"]
        self.base = float(self.meta[f"{a}.rope.freq_base"])
        self.eps = float(self.meta[f"{a}.attention.layer_norm_rms_epsilon"])
        self.n_ctx = self.meta[f"{a}.context_length"]
        self.head_dim = self.meta.get(f"{a}.attention.key_length", self.n_embd // self.n_head)
        assert self.meta.get(f"{a}.rope.dimension_count", self.head_dim) == self.head_dim
        self.neox = a in ("qwen2", "gemma3")
        self.gemma = a == "gemma3"
        self.window = self.meta.get(f"{a}.attention.sliding_window") if self.gemma else None
        self.types = {t.name: t.tensor_type.name for t in r.tensors}
        self.w = {}
        for t in r.tensors:
            x = dequantize(t.data, t.tensor_type)
            self.w[t.name] = x.reshape([int(n) for n in reversed(t.shape)]).astype(dtype)
        self.out_w = self.w.get("output.weight", self.w["token_embd.weight"])
        self.vocab = self.out_w.shape[0]

    def rmsnorm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def sliding(self, l):
        return self.window is not None and l % 6 < 5

    def rope(self, x, pos, base=None):  # x: [T, H, D]
        half = self.head_dim // 2
        theta = (base or self.base) ** (-2.0 * np.arange(half) / self.head_dim)  # float64
        ang = pos[:, None].astype(np.float64) * theta[None, :]
        cos = np.cos(ang)[:, None, :].astype(self.dtype)
        sin = np.sin(ang)[:, None, :].astype(self.dtype)
        out = np.empty_like(x)
        if self.neox:
            a, b = x[..., :half], x[..., half:]
            out[..., :half], out[..., half:] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def forward(self, ids, cache=None, all_logits=False):
        """Logits for `ids` (appended after `cache`, a list of per-layer (K, V) or None).
        Returns (logits [T, vocab] or [vocab] for the last position, new cache)."""
        ids = np.asarray(ids, dtype=np.int64)
        T, D, H, KV, hd = len(ids), self.n_embd, self.n_head, self.n_kv, self.head_dim
        p0 = 0 if cache is None else cache[0][0].shape[0]
        pos = np.arange(p0, p0 + T)
        S = p0 + T
        mask = np.where(np.arange(S)[None, :] <= pos[:, None], 0.0, -np.inf).astype(self.dtype)
        x = self.w["token_embd.weight"][ids]
        if self.gemma:
            x = x * np.sqrt(np.float64(D)).astype(self.dtype)
        new_cache = []
        for l in range(self.n_layer):
            p = f"blk.{l}."
            base = 10000.0 if self.sliding(l) else None
            h = self.rmsnorm(x, self.w[p + "attn_norm.weight"])
            q = self.lin(h, p + "attn_q").reshape(T, H, hd)
            k = self.lin(h, p + "attn_k").reshape(T, KV, hd)
            if self.gemma:
                q = self.rmsnorm(q, self.w[p + "attn_q_norm.weight"])
                k = self.rmsnorm(k, self.w[p + "attn_k_norm.weight"])
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            v = self.lin(h, p + "attn_v").reshape(T, KV, hd)
            if cache is not None:
                k = np.concatenate([cache[l][0], k])
                v = np.concatenate([cache[l][1], v])
            new_cache.append((k, v))
            lmask = mask
            if self.sliding(l):
                far = pos[:, None] - np.arange(S)[None, :] >= self.window
                lmask = np.where(far, -np.inf, mask).astype(self.dtype)
            g = H // KV  # query head h uses kv head h // g
            qg = q.reshape(T, KV, g, hd).transpose(1, 2, 0, 3)          # [KV, g, T, hd]
            s = np.einsum("kgtd,skd->kgts", qg, k) / np.sqrt(hd).astype(self.dtype) + lmask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("kgts,skd->tkgd", s, v).reshape(T, H * hd)
            o = self.lin(o, p + "attn_output")
            if self.gemma:
                o = self.rmsnorm(o, self.w[p + "post_attention_norm.weight"])
            x = x + o
            h = self.rmsnorm(x, self.w[p + "ffn_norm.weight"])
            gate = self.lin(h, p + "ffn_gate")
            if self.gemma:
                c = np.sqrt(2.0 / np.pi)
                act = 0.5 * gate * (1.0 + np.tanh(c * (gate + 0.044715 * gate ** 3)))
            else:
                act = gate / (1.0 + np.exp(-gate))
            f = self.lin(act * self.lin(h, p + "ffn_up"), p + "ffn_down")
            if self.gemma:
                f = self.rmsnorm(f, self.w[p + "post_ffw_norm.weight"])
            x = x + f
        x = self.rmsnorm(x if all_logits else x[-1:], self.w["output_norm.weight"])
        logits = x @ self.out_w.T
        return (logits if all_logits else logits[0]), new_cache

    def greedy(self, ids, n, stop=()):
        logits, cache = self.forward(ids)
        out = []
        for _ in range(n):
            t = int(np.argmax(logits))
            out.append(t)
            if t in stop:
                break
            logits, cache = self.forward([t], cache)
        return out


def chatml(question, system="You are a helpful assistant."):
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--question", default="What is the capital of France?")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--f64", action="store_true")
    a = ap.parse_args()
    from tokenizer_fixture import load_tokenizer
    t0 = time.time()
    m = Model(a.model, np.float64 if a.f64 else np.float32)
    tok = load_tokenizer(a.model)
    print(f"loaded {a.model}: arch={m.arch} layers={m.n_layer} d={m.n_embd} heads={m.n_head}/"
          f"{m.n_kv} base={m.base} eps={m.eps} vocab={m.vocab} ({time.time() - t0:.1f}s)")
    ids = tok.encode(chatml(a.question), add_special_tokens=False)
    t0 = time.time()
    out = m.greedy(ids, a.n, stop={tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")})
    print(f"prompt {len(ids)} tokens, generated {len(out)} in {time.time() - t0:.1f}s: {out}")
    print(repr(tok.decode(out, skip_special_tokens=False)))


if __name__ == "__main__":
    main()
