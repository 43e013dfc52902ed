#!/usr/bin/env python3
"""Synthetic GGUFs of the architectures users bring, with random weights, written reproducibly.

No GGUF of Qwen3, Llama 3.x, Phi-3/4, SmolLM3, Gemma 2, Granite or Qwen3-MoE can be fetched
here, so each is written with the `gguf` package: the tensor names, metadata keys and shapes
llama.cpp's converter writes, small but real shapes (several layers, GQA, head dims of 64 and
128), weights from a seeded generator, matrices in Q8_0 (quantized by `gguf` itself, so the
bytes are the same on every machine), norms in F32, and the tokenizer of a model we have that
the family shares (Qwen's for Qwen3, SmolLM2's GPT-2-style vocabulary under each family's
pre-tokenizer, Gemma's SentencePiece for Gemma 2 and Phi).

    python3 scripts/ref/synth.py [ARCH ...] [--out models/synth]     (default: every one)

Writes models/synth/<arch>.gguf and prints each file's SHA-256 (the reference fixtures of
scripts/ref/synth_logits.py name them, so a test knows it runs the file llama.cpp ran).
Needs numpy and gguf (scripts/test-requirements.txt) and the source models (scripts/models.py).
"""
import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen05": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

# Each architecture: its GGUF name, the tokenizer it borrows (and the pre-tokenizer it names),
# its shape, and what is particular to it.
ARCHS = {
    "qwen3": dict(
        arch="qwen3", tok="qwen05", n_embd=256, n_layer=4, n_head=4, n_kv=2, head_dim=128,
        n_ff=512, qk_norm=True, tied=True,
    ),
    "llama3": dict(
        arch="llama", tok="smollm2", pre="llama-bpe", n_embd=256, n_layer=4, n_head=8, n_kv=2,
        head_dim=32 * 2, n_ff=640, rope_freqs=True, tied=True, rope_base=500000.0,
    ),
    "granite": dict(
        arch="granite", tok="smollm2", pre="refact", n_embd=256, n_layer=4, n_head=4, n_kv=2,
        head_dim=64, n_ff=512, tied=True, embedding_scale=12.0, residual_scale=0.22,
        attention_scale=0.0078125, logit_scale=8.0,
    ),
    "smollm3": dict(
        arch="smollm3", tok="smollm2", pre="llama-bpe", n_embd=256, n_layer=8, n_head=4, n_kv=1,
        head_dim=64, n_ff=512, tied=True, rope_base=5000000.0,
    ),
    "phi3": dict(
        arch="phi3", tok="smollm2", pre="gpt-4o", n_embd=256, n_layer=4, n_head=2, n_kv=1,
        head_dim=128, n_ff=512, fused=True, rope_dims=96, rope_factors=True, tied=False,
        context=4096,
    ),
    "gemma2": dict(
        arch="gemma2", tok="gemma3", n_embd=256, n_layer=4, n_head=4, n_kv=2, head_dim=64,
        n_ff=512, gemma=True, window=16, attn_softcap=4.0, final_softcap=5.0, tied=True,
    ),
    # Tokenizer checks only: every pre-tokenizer name the engine accepts, on SmolLM2's vocabulary.
    **{
        f"tok_{pre.replace('-', '_')}": dict(
            arch="llama", tok="smollm2", pre=pre, n_embd=64, n_layer=1, n_head=2, n_kv=1,
            head_dim=32, n_ff=128, tied=True, tokenizer_only=True,
        )
        for pre in ("default", "llama3", "smaug-bpe", "llama4")
    },
    # A file that does not say whether prompts start with BOS: llama.cpp's default for the
    # pre-tokenizer (the Llama 3 family's: yes).
    "tok_lfm2_bos": dict(
        arch="llama", tok="smollm2", pre="lfm2", n_embd=64, n_layer=1, n_head=2, n_kv=1,
        head_dim=32, n_ff=128, tied=True, tokenizer_only=True,
        drop=("tokenizer.ggml.add_bos_token",),
    ),
    # Gemma 4's tokenizer ("gemma4": BPE merges over raw UTF-8, spaces as U+2581, the text cut
    # only at newline runs), on Gemma 3's vocabulary with merges made from it: each piece of
    # two or more characters joined from its longest prefix piece and the rest, ranked by the
    # SentencePiece scores (no such file can be fetched here).
    "tok_gemma4": dict(
        arch="llama", tok="gemma3", pre="gemma4", n_embd=64, n_layer=1, n_head=2, n_kv=1,
        head_dim=32, n_ff=128, tied=True, tokenizer_only=True, tok_model="gemma4",
    ),
    # A hybrid: six Gated DeltaNet layers and two gated attention layers (every fourth), value
    # heads twice the key heads, partial RoPE in interleaved sections, and one MTP block after
    # the trunk (which llama.cpp and the engine both leave unread).
    "qwen35": dict(
        arch="qwen35", tok="qwen05", pre="qwen35", n_embd=256, n_layer=8, n_head=4, n_kv=2,
        head_dim=64, n_ff=512, rope_dims=16, sections=[3, 3, 2, 0], ssm=(4, 2, 4, 32),
        attn_every=4, mtp=1, tied=True, rope_base=10000000.0,
    ),
    # Qwen3.5-0.8B's widths (1024 wide; attention 8 heads of 256 with 2 KV heads, RoPE on 64 of
    # them in sections 11/11/10; DeltaNet 16 key and 16 value heads of 128, width-4 convolution;
    # FFN 3584) in four of its layers: three DeltaNet, one attention.
    "qwen35-0.8b-shape": dict(
        arch="qwen35", tok="qwen05", pre="qwen35", n_embd=1024, n_layer=4, n_head=8, n_kv=2,
        head_dim=256, n_ff=3584, rope_dims=64, sections=[11, 11, 10, 0], ssm=(4, 16, 16, 128),
        attn_every=4, tied=True, rope_base=10000000.0,
    ),
    # The MoE hybrid: qwen35's trunk in four layers (three DeltaNet, one attention), each FFN
    # eight routed experts (two used) whose gate and up share one stack, and a gated shared
    # expert; an MTP block (with its own experts) after the trunk. The layers' matrices in F32:
    # with 8-bit activations the two implementations' hidden states differ enough that a
    # router's near tie picks another expert in one or the other (seen: a 0.007 logit gap,
    # cosine 0.997 at that token); in F32 they agree to float rounding.
    "qwen35moe": dict(
        arch="qwen35moe", tok="qwen05", pre="qwen35", n_embd=256, n_layer=4, n_head=4, n_kv=2,
        head_dim=64, n_ff=512, rope_dims=16, sections=[3, 3, 2, 0], ssm=(4, 2, 4, 32),
        attn_every=4, mtp=1, tied=False, rope_base=10000000.0, experts=8, experts_used=2,
        n_ff_exp=128, shared_ff=256, layer_fmt="F32",
    ),
    # LFM2's hybrid (LFM2-350M's pattern in six layers): short convolutions of three taps where
    # the per-layer KV head count is 0, GQA with Q/K norms in the others; the final norm named
    # `token_embd_norm`; Llama 3's pre-tokenizer under LFM2's name.
    "lfm2": dict(
        arch="lfm2", tok="smollm2", pre="lfm2", n_embd=256, n_layer=6, n_head=4, n_kv=2,
        head_dim=64, n_ff=512, tied=True, shortconv=3, attn_layers=[2, 5], rope_base=1000000.0,
        qk_norm=True,
    ),
    # Gemma 4's edge layout in nine layers: sliding (head size 64, window 16, RoPE base 10k)
    # and global (head size 128, proportional RoPE on a quarter of its pairs) as S S G, the last
    # three reading the KV of layers 4 (sliding) and 5 (global) and twice as wide in the FFN;
    # per-layer embeddings of 32 values (table in Q8_0); the global layers without a V
    # projection (K serves); a per-layer output scale; logits soft-capped. Scores are not
    # scaled (Gemma 4 leaves that to its Q norm): the Q norm's weights here are a tenth, so
    # scores are a few units as a trained model's. At ten times that this random model is
    # chaotic: rounding our own Q to f16 moved our logits to cosine 0.965 of themselves, and
    # llama.cpp's to 0.970 of ours; at a tenth the two agree at 0.9995.
    "gemma4": dict(
        arch="gemma4", tok="smollm2", n_embd=256, n_layer=9, n_head=4, n_kv=2, head_dim=128,
        head_dim_swa=64, n_ff=512, window=16, pattern=[True, True, False] * 3, shared_kv=3,
        ple=32, final_softcap=30.0, tied=True, rope_base=1000000.0, gemma4=True, qn=0.1,
    ),
    # Gemma 4 E2B's widths (1536 wide; 8 query heads and 1 KV head, of 256 on the sliding
    # layers and 512 on the global ones; FFN 6144, doubled on the shared-KV layers; window
    # 512; per-layer embeddings of 256) in four of its layers: sliding and global owning KV,
    # then one of each reading theirs.
    "gemma4-e2b-shape": dict(
        arch="gemma4", tok="smollm2", n_embd=1536, n_layer=4, n_head=8, n_kv=1, head_dim=512,
        head_dim_swa=256, n_ff=6144, window=512, pattern=[True, False, True, False],
        shared_kv=2, ple=256, final_softcap=30.0, tied=True, rope_base=1000000.0, gemma4=True,
        qn=0.1,
    ),
    "qwen3moe": dict(
        arch="qwen3moe", tok="qwen05", n_embd=256, n_layer=4, n_head=4, n_kv=2, head_dim=64,
        n_ff=512, qk_norm=True, experts=8, experts_used=2, n_ff_exp=128, tied=False,
    ),
    # The formats our packed kernels do not run, every matrix (the embedding and tied head
    # too) in one of them: F16, BF16 and Q5_1 quantized by `gguf`; the K- and i-quants (which
    # `gguf` cannot quantize) as seeded random blocks scaled like the float weights.
    **{
        f"fmt_{f.lower()}": dict(
            arch="llama", tok="smollm2", n_embd=256, n_layer=2, n_head=4, n_kv=2, head_dim=64,
            n_ff=512, tied=True, fmt=f,
        )
        for f in ("F16", "BF16", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "IQ4_NL", "IQ4_XS")
    },
}


# Real shapes, for speed against llama.cpp only (scripts/bench_families.sh quantizes them to
# Q4_K_M with llama.cpp's quantizer); never written by default. Qwen3-0.6B's own shape; Llama
# 3.2 1B's with Qwen's 152k vocabulary for its 128k one; Qwen3-30B-A3B's experts (128, 8 used,
# 768 wide, in a 2048-wide model) in 4 of its 48 layers.
BENCH = {
    "qwen3-0.6b": dict(
        arch="qwen3", tok="qwen05", n_embd=1024, n_layer=28, n_head=16, n_kv=8, head_dim=128,
        n_ff=3072, qk_norm=True, tied=True,
    ),
    "llama3.2-1b": dict(
        arch="llama", tok="qwen05", pre="llama-bpe", n_embd=2048, n_layer=16, n_head=32, n_kv=8,
        head_dim=64, n_ff=8192, rope_freqs=True, tied=True, rope_base=500000.0,
    ),
    # Qwen3.5-0.8B's shape (with Qwen2.5's 152k vocabulary for its 248k one).
    "qwen35-0.8b": dict(
        arch="qwen35", tok="qwen05", pre="qwen35", n_embd=1024, n_layer=24, n_head=8, n_kv=2,
        head_dim=256, n_ff=3584, rope_dims=64, sections=[11, 11, 10, 0], ssm=(4, 16, 16, 128),
        attn_every=4, tied=True, rope_base=10000000.0,
    ),
    # Gemma 4 E2B's shape: 35 layers (four sliding, then a global one), the last 20 reading
    # layers 13 and 14's KV, per-layer embeddings of 256 over Gemma's 262k vocabulary (the
    # table most of the file, as E2B's).
    "gemma4-e2b": dict(
        arch="gemma4", tok="gemma3", n_embd=1536, n_layer=35, n_head=8, n_kv=1, head_dim=512,
        head_dim_swa=256, n_ff=6144, window=512, pattern=[True, True, True, True, False] * 7,
        shared_kv=20, ple=256, final_softcap=30.0, tied=True, rope_base=1000000.0, gemma4=True,
        qn=0.1, context=32768,
    ),
    # The same layers with every one owning its KV (no shared-KV layers), for what sharing
    # saves on the wire (SmolLM2's vocabulary: the bytes sent do not depend on it).
    "gemma4-e2b-own": dict(
        arch="gemma4", tok="smollm2", n_embd=1536, n_layer=35, n_head=8, n_kv=1, head_dim=512,
        head_dim_swa=256, n_ff=6144, window=512, pattern=[True, True, True, True, False] * 7,
        shared_kv=0, ple=256, final_softcap=30.0, tied=True, rope_base=1000000.0, gemma4=True,
        qn=0.1, context=32768,
    ),
    "qwen3moe-a3b": dict(
        arch="qwen3moe", tok="qwen05", n_embd=2048, n_layer=4, n_head=32, n_kv=4, head_dim=128,
        n_ff=6144, qk_norm=True, experts=128, experts_used=8, n_ff_exp=768, tied=False,
    ),
}


def sources_dir():
    import os
    return Path(os.environ.get("EDGEPROMPT_MODELS", ROOT / "models"))


def tokenizer_fields(src: Path):
    """The tokenizer.* fields of a GGUF we have, as (key, value, type)."""
    r = gguf.GGUFReader(src)
    out = []
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1]
            if sub == gguf.GGUFValueType.STRING:
                val = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                val = [f.parts[i].tolist()[0] for i in f.data]
            out.append((key, val, t, sub))
        elif t == gguf.GGUFValueType.STRING:
            out.append((key, bytes(f.parts[f.data[0]]).decode("utf-8"), t, None))
        else:
            out.append((key, f.parts[f.data[0]].tolist()[0], t, None))
    return out


def spaced_merges(tokens, scores):
    """BPE merges for a SentencePiece vocabulary: every piece of two or more characters that
    splits into two pieces (its longest proper prefix that is one, and the rest), best score
    first."""
    ids = {t: i for i, t in enumerate(tokens)}
    out = []
    for i in sorted(range(len(tokens)), key=lambda i: -scores[i]):
        t = tokens[i]
        if len(t) < 2 or (t.startswith("<") and t.endswith(">")):
            continue
        for cut in range(len(t) - 1, 0, -1):
            if t[:cut] in ids and t[cut:] in ids:
                out.append(f"{t[:cut]} {t[cut:]}")
                break
    return out


def write_tokenizer(w: gguf.GGUFWriter, fields, pre, drop=(), model=None):
    if model == "gemma4":
        tokens = next(v for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
        scores = next(v for k, v, *_ in fields if k == "tokenizer.ggml.scores")
        w.add_array("tokenizer.ggml.merges", spaced_merges(tokens, scores))
    for key, val, t, sub in fields:
        if key in drop:
            continue
        if key == "tokenizer.ggml.model" and model is not None:
            val = model
        if key == "tokenizer.ggml.pre" and pre is not None:
            val = pre
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(key, val) if sub != gguf.GGUFValueType.STRING else w.add_array(key, val)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(key, val)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(key, bool(val))
        elif t in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32):
            w.add_uint32(key, int(val))
        elif t == gguf.GGUFValueType.FLOAT32:
            w.add_float32(key, float(val))
        else:
            w.add_key_value(key, val, t)
    if pre is not None and not any(k == "tokenizer.ggml.pre" for k, *_ in fields):
        w.add_tokenizer_pre(pre)


class Weights:
    """Seeded weights: matrices scaled so activations stay near unit size (`single`: drawn in
    float32 directly, for the large bench shapes)."""

    def __init__(self, seed, single=False):
        self.rng = np.random.default_rng(seed)
        self.single = single

    def matrix(self, rows, cols, scale=None):
        s = scale if scale is not None else 1.0 / np.sqrt(cols)
        if self.single:
            m = self.rng.standard_normal((rows, cols), dtype=np.float32)
            m *= np.float32(s)
            return m
        return (self.rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def norm(self, n, around=1.0):
        return (around + 0.1 * self.rng.standard_normal(n)).astype(np.float32)


# Where a block keeps its scale (and its min) as float16, for the formats written as random
# blocks.
SCALES = {Q.Q2_K: (80, 82), Q.Q3_K: (108, None), Q.Q5_K: (0, 2), Q.IQ4_NL: (0, None), Q.IQ4_XS: (0, None)}


def random_blocks(m, qt, rng):
    """Random blocks of `qt` whose values have `m`'s spread: each block's scale (and min, which
    centres it) set from what its quants expand to."""
    rows, cols = m.shape
    per, size = gguf.GGML_QUANT_SIZES[qt]
    nb = rows * cols // per
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    dpos, mpos = SCALES[qt]

    def put(pos, v):
        raw[:, pos:pos + 2] = np.asarray(v, dtype=np.float16).reshape(nb, 1).view(np.uint8)

    def expand():
        return gguf.quants.dequantize(raw.reshape(rows, -1), qt).reshape(nb, per).astype(np.float64)

    put(dpos, np.ones(nb))
    if mpos is not None:
        put(mpos, np.zeros(nb))
    a = expand()
    d = m.std() / np.maximum(a.std(axis=1), 1e-6)
    if mpos is not None:
        put(dpos, np.zeros(nb))
        put(mpos, np.ones(nb))
        b = -expand()
        put(dpos, d)
        put(mpos, d * a.mean(axis=1) / np.maximum(b.mean(axis=1), 1e-6))
    else:
        put(dpos, d)
    return raw.reshape(rows, -1)


def add_matrix(w: gguf.GGUFWriter, name, m, fmt="Q8_0", rng=None):
    qt = Q[fmt]
    if qt in SCALES:
        q = random_blocks(m.reshape(-1, m.shape[-1]), qt, rng).reshape(*m.shape[:-1], -1)
    elif qt == Q.F16:
        w.add_tensor(name, m.astype(np.float16))
        return
    else:
        q = gguf.quants.quantize(m, qt)
    w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)


def write(name: str, spec: dict, out: Path) -> Path:
    s = dict(spec)
    src = sources_dir() / SOURCES[s["tok"]]
    if not src.exists():
        sys.exit(f"{src} missing: python3 scripts/models.py {s['tok']}")
    fields = tokenizer_fields(src)
    vocab = next(len(v) for k, v, *_ in fields if k == "tokenizer.ggml.tokens")
    arch = s["arch"]
    d, hd, nh, nkv, ff, nl = (s[k] for k in ("n_embd", "head_dim", "n_head", "n_kv", "n_ff", "n_layer"))
    path = out / f"{name}.gguf"
    w = gguf.GGUFWriter(path, arch)
    # A plain name: llama.cpp sets token attributes by names it knows ("phi3", ...).
    w.add_name("synthetic")
    w.add_context_length(s.get("context", 8192))
    w.add_embedding_length(d)
    w.add_block_count(nl + s.get("mtp", 0))
    if s.get("gemma4"):
        # The shared-KV layers' FFN twice as wide (E2B's `use_double_wide_mlp`).
        w.add_feed_forward_length([ff if l < nl - s["shared_kv"] else 2 * ff for l in range(nl)])
        w.add_key_length_swa(s["head_dim_swa"])
        w.add_value_length_swa(s["head_dim_swa"])
        w.add_rope_dimension_count(hd)
        w.add_rope_dimension_count_swa(s["head_dim_swa"])
        w.add_rope_freq_base_swa(10000.0)
        w.add_sliding_window_pattern(s["pattern"])
        w.add_shared_kv_layers(s["shared_kv"])
        w.add_embedding_length_per_layer_input(s["ple"])
        w.add_final_logit_softcapping(s["final_softcap"])
    else:
        w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    if "shortconv" in s:
        w.add_head_count_kv([nkv if l in s["attn_layers"] else 0 for l in range(nl)])
        w.add_uint32(f"{arch}.shortconv.l_cache", s["shortconv"])
    else:
        w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(s.get("rope_base", 1000000.0))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    if "rope_dims" in s:
        w.add_rope_dimension_count(s["rope_dims"])
    if "window" in s:
        w.add_sliding_window(s["window"])
    if "ssm" in s:
        conv, kh, vh, sd = s["ssm"]
        w.add_array(f"{arch}.rope.dimension_sections", s["sections"])
        w.add_uint32(f"{arch}.ssm.conv_kernel", conv)
        w.add_uint32(f"{arch}.ssm.group_count", kh)
        w.add_uint32(f"{arch}.ssm.time_step_rank", vh)
        w.add_uint32(f"{arch}.ssm.state_size", sd)
        w.add_uint32(f"{arch}.ssm.inner_size", vh * sd)
        w.add_uint32(f"{arch}.full_attention_interval", s["attn_every"])
    if s.get("mtp"):
        w.add_uint32(f"{arch}.nextn_predict_layers", s["mtp"])
    if "attn_softcap" in s:
        w.add_attn_logit_softcapping(s["attn_softcap"])
        w.add_final_logit_softcapping(s["final_softcap"])
    for key in ("embedding_scale", "residual_scale", "attention_scale", "logit_scale"):
        if key in s:
            getattr(w, f"add_{key}")(s[key])
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["experts_used"])
        w.add_expert_feed_forward_length(s["n_ff_exp"])
    if "shared_ff" in s:
        w.add_uint32(f"{arch}.expert_shared_feed_forward_length", s["shared_ff"])
    write_tokenizer(w, fields, s.get("pre"), s.get("drop", ()), s.get("tok_model"))

    g = Weights(seed=sum(map(ord, name)), single=name in BENCH)
    fmt = s.get("fmt", "Q8_0")
    # Embeddings of unit rows (Gemma scales them by sqrt(width) itself).
    embd_scale = 1.0 / np.sqrt(d) if s.get("gemma") or s.get("gemma4") else 1.0
    add_matrix(w, "token_embd.weight", g.matrix(vocab, d, embd_scale), fmt, g.rng)
    w.add_tensor("token_embd_norm.weight" if "shortconv" in s else "output_norm.weight", g.norm(d))
    if not s.get("tied"):
        add_matrix(w, "output.weight", g.matrix(vocab, d), fmt, g.rng)
    rot = s.get("rope_dims", hd)
    if s.get("rope_freqs"):
        # Llama 3's long-context scaling: per-frequency divisors (steeper than Llama's own, so
        # short prompts feel them).
        f = np.linspace(1.0, 32.0, rot // 2, dtype=np.float32)
        w.add_tensor("rope_freqs.weight", f)
    if s.get("rope_factors"):
        w.add_tensor("rope_factors_short.weight", (1.0 + 0.5 * g.rng.random(rot // 2)).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", (1.0 + 4.0 * g.rng.random(rot // 2)).astype(np.float32))
    qd, kvd = nh * hd, nkv * hd
    fmt = s.get("layer_fmt", fmt)
    if "ssm" in s:
        write_hybrid(w, g, s, fmt)
        nl = 0
    if s.get("gemma4"):
        write_gemma4(w, g, s, fmt, vocab)
        nl = 0
    for l in range(nl):
        p = f"blk.{l}"
        w.add_tensor(f"{p}.attn_norm.weight", g.norm(d))
        if "shortconv" in s and l not in s["attn_layers"]:
            # LFM2's short convolution: B, C and X in one projection, taps per channel.
            add_matrix(w, f"{p}.shortconv.in_proj.weight", g.matrix(3 * d, d), fmt, g.rng)
            w.add_tensor(f"{p}.shortconv.conv.weight", g.matrix(d, s["shortconv"], 0.5))
            add_matrix(w, f"{p}.shortconv.out_proj.weight", g.matrix(d, d), fmt, g.rng)
            w.add_tensor(f"{p}.ffn_norm.weight", g.norm(d))
            add_matrix(w, f"{p}.ffn_gate.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_up.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_down.weight", g.matrix(d, ff), fmt, g.rng)
            continue
        if s.get("fused"):
            add_matrix(w, f"{p}.attn_qkv.weight", g.matrix(qd + 2 * kvd, d), fmt, g.rng)
        else:
            add_matrix(w, f"{p}.attn_q.weight", g.matrix(qd, d), fmt, g.rng)
            add_matrix(w, f"{p}.attn_k.weight", g.matrix(kvd, d), fmt, g.rng)
            add_matrix(w, f"{p}.attn_v.weight", g.matrix(kvd, d), fmt, g.rng)
        add_matrix(w, f"{p}.attn_output.weight", g.matrix(d, qd), fmt, g.rng)
        if s.get("qk_norm"):
            w.add_tensor(f"{p}.attn_q_norm.weight", g.norm(hd))
            w.add_tensor(f"{p}.attn_k_norm.weight", g.norm(hd))
        if s.get("gemma"):
            w.add_tensor(f"{p}.post_attention_norm.weight", g.norm(d))
            w.add_tensor(f"{p}.post_ffw_norm.weight", g.norm(d))
        w.add_tensor(f"{p}.ffn_norm.weight", g.norm(d))
        if "experts" in s:
            e, fe = s["experts"], s["n_ff_exp"]
            # The router stays F32, as llama.cpp's converter and quantizer keep it.
            w.add_tensor(f"{p}.ffn_gate_inp.weight", g.matrix(e, d))
            for part, rows, cols in (("gate", fe, d), ("up", fe, d), ("down", d, fe)):
                m = np.stack([g.matrix(rows, cols) for _ in range(e)])
                add_matrix(w, f"{p}.ffn_{part}_exps.weight", m, fmt, g.rng)
        elif s.get("fused"):
            add_matrix(w, f"{p}.ffn_up.weight", g.matrix(2 * ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_down.weight", g.matrix(d, ff), fmt, g.rng)
        else:
            add_matrix(w, f"{p}.ffn_gate.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_up.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_down.weight", g.matrix(d, ff), fmt, g.rng)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hybrid(w: gguf.GGUFWriter, g: Weights, s: dict, fmt: str):
    """Qwen3.5's layers: Gated DeltaNet ones (fused QKV, output gate z, write strength beta and
    decay input alpha per value head, a width-4 depthwise convolution, decay rates A < 0 and
    their bias, the gated norm, the output) and, every `attn_every`-th, gated attention (Q
    projected twice as wide, each head's Q rows then its gate's; Q/K norms); the norm before
    the FFN is `post_attention_norm`. Then the MTP blocks, as a full-attention block with the
    next-n projections."""
    d, hd, nh, nkv, ff, nl = (s[k] for k in ("n_embd", "head_dim", "n_head", "n_kv", "n_ff", "n_layer"))
    conv, kh, vh, sd = s["ssm"]
    key, val = kh * sd, vh * sd

    def attention(p):
        add_matrix(w, f"{p}.attn_q.weight", g.matrix(2 * nh * hd, d), fmt, g.rng)
        add_matrix(w, f"{p}.attn_k.weight", g.matrix(nkv * hd, d), fmt, g.rng)
        add_matrix(w, f"{p}.attn_v.weight", g.matrix(nkv * hd, d), fmt, g.rng)
        add_matrix(w, f"{p}.attn_output.weight", g.matrix(d, nh * hd), fmt, g.rng)
        w.add_tensor(f"{p}.attn_q_norm.weight", g.norm(hd))
        w.add_tensor(f"{p}.attn_k_norm.weight", g.norm(hd))

    def ffn(p):
        if "experts" not in s:
            add_matrix(w, f"{p}.ffn_gate.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_up.weight", g.matrix(ff, d), fmt, g.rng)
            add_matrix(w, f"{p}.ffn_down.weight", g.matrix(d, ff), fmt, g.rng)
            return
        # Qwen3.5-MoE: the router (F32), each expert's gate rows then its up rows in one
        # stack, the experts' down; the shared expert and its gate vector.
        e, fe, sf = s["experts"], s["n_ff_exp"], s["shared_ff"]
        w.add_tensor(f"{p}.ffn_gate_inp.weight", g.matrix(e, d))
        gate_up = np.stack([np.concatenate([g.matrix(fe, d), g.matrix(fe, d)]) for _ in range(e)])
        add_matrix(w, f"{p}.ffn_gate_up_exps.weight", gate_up, fmt, g.rng)
        add_matrix(w, f"{p}.ffn_down_exps.weight", np.stack([g.matrix(d, fe) for _ in range(e)]), fmt, g.rng)
        w.add_tensor(f"{p}.ffn_gate_inp_shexp.weight", g.matrix(1, d).reshape(d))
        add_matrix(w, f"{p}.ffn_gate_shexp.weight", g.matrix(sf, d), fmt, g.rng)
        add_matrix(w, f"{p}.ffn_up_shexp.weight", g.matrix(sf, d), fmt, g.rng)
        add_matrix(w, f"{p}.ffn_down_shexp.weight", g.matrix(d, sf), fmt, g.rng)

    for l in range(nl):
        p = f"blk.{l}"
        w.add_tensor(f"{p}.attn_norm.weight", g.norm(d))
        w.add_tensor(f"{p}.post_attention_norm.weight", g.norm(d))
        if (l + 1) % s["attn_every"] == 0:
            attention(p)
        else:
            add_matrix(w, f"{p}.attn_qkv.weight", g.matrix(2 * key + val, d), fmt, g.rng)
            add_matrix(w, f"{p}.attn_gate.weight", g.matrix(val, d), fmt, g.rng)
            w.add_tensor(f"{p}.ssm_conv1d.weight", g.matrix(2 * key + val, conv, 0.5))
            w.add_tensor(f"{p}.ssm_dt.bias", (0.5 + 0.2 * g.rng.standard_normal(vh)).astype(np.float32))
            # A = -exp(A_log), rates between 0.05 and 1: decays that keep a prompt in mind.
            w.add_tensor(f"{p}.ssm_a", (-np.exp(g.rng.uniform(np.log(0.05), 0.0, vh))).astype(np.float32))
            add_matrix(w, f"{p}.ssm_beta.weight", g.matrix(vh, d), fmt, g.rng)
            add_matrix(w, f"{p}.ssm_alpha.weight", g.matrix(vh, d), fmt, g.rng)
            w.add_tensor(f"{p}.ssm_norm.weight", g.norm(sd))
            add_matrix(w, f"{p}.ssm_out.weight", g.matrix(d, val), fmt, g.rng)
        ffn(p)
    for l in range(nl, nl + s.get("mtp", 0)):
        p = f"blk.{l}"
        w.add_tensor(f"{p}.attn_norm.weight", g.norm(d))
        w.add_tensor(f"{p}.post_attention_norm.weight", g.norm(d))
        attention(p)
        ffn(p)
        add_matrix(w, f"{p}.nextn.eh_proj.weight", g.matrix(d, 2 * d), fmt, g.rng)
        w.add_tensor(f"{p}.nextn.enorm.weight", g.norm(d))
        w.add_tensor(f"{p}.nextn.hnorm.weight", g.norm(d))


def write_gemma4(w: gguf.GGUFWriter, g: Weights, s: dict, fmt: str, vocab: int):
    """Gemma 4's layers (llama.cpp's names): per-kind head sizes, Q/K norms, V optional (the
    global layers here have none), no K or V on the shared-KV layers, norms after attention
    and FFN, the per-layer embedding's gate, projection and norm, the output scale; and the
    model's per-layer table, its projection of the embedding and that projection's norm, and
    the global layers' proportional-RoPE divisors."""
    d, hd, nh, nkv, ff, nl = (s[k] for k in ("n_embd", "head_dim", "n_head", "n_kv", "n_ff", "n_layer"))
    ple, owners = s["ple"], nl - s["shared_kv"]
    rot = hd // 8  # a quarter of the global heads' pairs rotate
    w.add_tensor("rope_freqs.weight", np.array([1.0] * rot + [1e30] * (hd // 2 - rot), dtype=np.float32))
    if ple:
        # Made and quantized a slab of rows at a time: E2B's is 2.3G values.
        rows = max(1, (1 << 24) // (nl * ple))
        table = np.concatenate([
            gguf.quants.quantize(g.matrix(min(rows, vocab - r), nl * ple, 1.0), Q[fmt])
            for r in range(0, vocab, rows)
        ])
        w.add_tensor("per_layer_token_embd.weight", table, raw_shape=table.shape, raw_dtype=Q[fmt])
        add_matrix(w, "per_layer_model_proj.weight", g.matrix(nl * ple, d), fmt, g.rng)
        w.add_tensor("per_layer_proj_norm.weight", g.norm(ple))
    for l in range(nl):
        p = f"blk.{l}"
        sliding = s["pattern"][l]
        h = s["head_dim_swa"] if sliding else hd
        f = ff if l < owners else 2 * ff
        w.add_tensor(f"{p}.attn_norm.weight", g.norm(d))
        add_matrix(w, f"{p}.attn_q.weight", g.matrix(nh * h, d), fmt, g.rng)
        w.add_tensor(f"{p}.attn_q_norm.weight", g.norm(h) * s["qn"])
        if l < owners:
            add_matrix(w, f"{p}.attn_k.weight", g.matrix(nkv * h, d), fmt, g.rng)
            w.add_tensor(f"{p}.attn_k_norm.weight", g.norm(h))
            if sliding:
                add_matrix(w, f"{p}.attn_v.weight", g.matrix(nkv * h, d), fmt, g.rng)
        add_matrix(w, f"{p}.attn_output.weight", g.matrix(d, nh * h), fmt, g.rng)
        w.add_tensor(f"{p}.post_attention_norm.weight", g.norm(d))
        w.add_tensor(f"{p}.ffn_norm.weight", g.norm(d))
        add_matrix(w, f"{p}.ffn_gate.weight", g.matrix(f, d), fmt, g.rng)
        add_matrix(w, f"{p}.ffn_up.weight", g.matrix(f, d), fmt, g.rng)
        add_matrix(w, f"{p}.ffn_down.weight", g.matrix(d, f), fmt, g.rng)
        w.add_tensor(f"{p}.post_ffw_norm.weight", g.norm(d))
        if ple:
            add_matrix(w, f"{p}.inp_gate.weight", g.matrix(ple, d), fmt, g.rng)
            add_matrix(w, f"{p}.proj.weight", g.matrix(d, ple), fmt, g.rng)
            w.add_tensor(f"{p}.post_norm.weight", g.norm(d))
        scale = 0.8 + 0.2 * g.rng.random()
        w.add_tensor(f"{p}.layer_output_scale.weight", np.array([scale], dtype=np.float32))


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="*", default=list(ARCHS))
    ap.add_argument("--out", default=str(ROOT / "models" / "synth"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in a.archs:
        path = write(name, ARCHS.get(name) or BENCH[name], out)
        print(f"{name}: {path} sha256 {sha256(path)}")


if __name__ == "__main__":
    main()
