"""Qwen2 (the CE-LSLM edge model's family) in PyTorch, from its GGUF, for training the KV fuser:
the forward pass over a suffix that attends to a given prompt KV, so the loss on the answer
reaches the prompt KV by backpropagation. The weights are dequantized to f32 and frozen; the
engine's own forward pass (quantized activations) differs from this one only by rounding, which
`train.py` measures against the engine's per-token losses before it trains.
"""
import gguf
import numpy as np
import torch


def _field(reader, name):
    f = reader.fields[name]
    return f.parts[f.data[0]][0]


class Rope:
    """NeoX-style RoPE (rotate the two halves of each head), as Qwen2 applies it."""

    def __init__(self, head_dim, base, max_pos=32768):
        inv = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
        ang = np.outer(np.arange(max_pos, dtype=np.float64), inv)
        self.cos = torch.tensor(np.cos(ang), dtype=torch.float32)
        self.sin = torch.tensor(np.sin(ang), dtype=torch.float32)
        self.half = head_dim // 2

    def _rot(self, x, pos, sign):
        # x: [..., n, heads, head_dim]; pos: [n]
        c, s = self.cos[pos][:, None, :], sign * self.sin[pos][:, None, :]
        a, b = x[..., : self.half], x[..., self.half:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    def apply(self, x, pos):
        return self._rot(x, pos, 1.0)

    def unapply(self, x, pos):
        return self._rot(x, pos, -1.0)


class Qwen2:
    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        self.n_layer = int(_field(r, "qwen2.block_count"))
        self.n_embd = int(_field(r, "qwen2.embedding_length"))
        self.n_head = int(_field(r, "qwen2.attention.head_count"))
        self.n_kv_head = int(_field(r, "qwen2.attention.head_count_kv"))
        self.eps = float(_field(r, "qwen2.attention.layer_norm_rms_epsilon"))
        self.rope_base = float(_field(r, "qwen2.rope.freq_base"))
        self.head_dim = self.n_embd // self.n_head
        w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            w[t.name] = torch.tensor(np.ascontiguousarray(a, dtype=np.float32))
        self.w = w
        self.out = w.get("output.weight", w["token_embd.weight"])
        self.rope = Rope(self.head_dim, self.rope_base)

    def norm(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def forward(self, ids, past, pos0, logits_from):
        """Hidden states of `ids` (positions pos0..) after the prompt KV `past` (per layer
        (K rotated, V), each [pos0, kv_heads * head_dim]); logits of rows logits_from..."""
        n, hd, nh, nkv = len(ids), self.head_dim, self.n_head, self.n_kv_head
        pos = torch.arange(pos0, pos0 + n)
        x = self.w["token_embd.weight"][ids]
        total = pos0 + n
        # Causal mask over [prompt, suffix]: suffix row i sees prompt and suffix 0..=i.
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=pos0)
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.norm(x, self.w[p + "attn_norm.weight"])
            q = (h @ self.w[p + "attn_q.weight"].T + self.w[p + "attn_q.bias"]).view(n, nh, hd)
            k = (h @ self.w[p + "attn_k.weight"].T + self.w[p + "attn_k.bias"]).view(n, nkv, hd)
            v = (h @ self.w[p + "attn_v.weight"].T + self.w[p + "attn_v.bias"]).view(n, nkv, hd)
            q, k = self.rope.apply(q, pos), self.rope.apply(k, pos)
            pk, pv = past[l]
            k = torch.cat([pk.view(pos0, nkv, hd), k], 0)
            v = torch.cat([pv.view(pos0, nkv, hd), v], 0)
            rep = nh // nkv
            k = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # [nh, total, hd]
            v = v.repeat_interleave(rep, dim=1).transpose(0, 1)
            att = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k, v, attn_mask=mask)
            x = x + att.transpose(0, 1).reshape(n, nh * hd) @ self.w[p + "attn_output.weight"].T
            h = self.norm(x, self.w[p + "ffn_norm.weight"])
            g = torch.nn.functional.silu(h @ self.w[p + "ffn_gate.weight"].T)
            x = x + (g * (h @ self.w[p + "ffn_up.weight"].T)) @ self.w[p + "ffn_down.weight"].T
        x = self.norm(x[logits_from:], self.w["output_norm.weight"])
        return x @ self.out.T
