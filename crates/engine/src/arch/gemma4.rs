//! Gemma 4's dense models (`gemma4`: E2B, E4B): Gemma 3's layer (norms before and after the
//! attention and the FFN, GELU, NEOX RoPE, per-head Q/K norms, sliding and global layers)
//! with
//!
//! - sliding and global layers of different head sizes (`key_length_swa`) and RoPE bases,
//!   the layer kinds listed per layer (`sliding_window_pattern`); the global layers' RoPE
//!   proportional (`rope_freqs` divisors of 1e30 leave all but the first quarter of each
//!   head's pairs in place);
//! - V normed without a weight (K serving as V where a layer has no V projection), and
//!   scores not scaled (scale 1);
//! - the last `shared_kv_layers` layers attending with the KV of the last owning layer of
//!   their kind instead of their own (`kv_sources`): their KV is never computed or held;
//! - per-layer embeddings (PLE): a table of `embedding_length_per_layer_input` values per
//!   layer per token plus a projection of the embedding, gated into each layer's output;
//! - a scalar output scale per layer, and the logits soft-capped.
//!
//! The MoE variant (26B-A4B: experts beside a dense MLP, its own router norm) is refused.

use super::RopeStyle;
use super::{Features, Meta};
use crate::gguf::Value;
use crate::{EngineError, Result};

/// Widest per-layer embedding accepted (E2B, E4B: 256).
const MAX_PER_LAYER: usize = 1024;

pub fn features(plain: Features, m: &Meta, n_embd: usize) -> Result<Features> {
    if m.has("blk.0.ffn_gate_inp.weight") {
        return Err(EngineError::Unsupported(
            "Gemma 4 with experts (26B-A4B)".into(),
        ));
    }
    let per_layer_embd = m.usize("embedding_length_per_layer_input").unwrap_or(0);
    if per_layer_embd > MAX_PER_LAYER {
        return Err(EngineError::Unsupported(format!(
            "per-layer embeddings of {per_layer_embd} values"
        )));
    }
    Ok(Features {
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        v_norm: true,
        post_norms: true,
        gelu: true,
        embed_scale: (n_embd as f32).sqrt(),
        attn_scale: 1.0,
        final_softcap: m.f32("final_logit_softcapping").filter(|&c| c > 0.0),
        window_rope_base: Some(10_000.0),
        per_layer_embd,
        ..plain
    })
}

/// Per layer (of the first `n_layer`): whether it slides, from the GGUF's list.
pub fn sliding_layers(m: &Meta, n_layer: usize) -> Result<Vec<bool>> {
    let bad =
        || EngineError::Gguf("attention.sliding_window_pattern: not one flag per layer".into());
    match m
        .content
        .metadata
        .get(&m.key("attention.sliding_window_pattern"))
    {
        Some(Value::Array(v)) if v.len() >= n_layer => v[..n_layer]
            .iter()
            .map(|x| match x {
                Value::Bool(b) => Some(*b),
                other => other.to_u32().map(|n| n != 0),
            })
            .collect::<Option<Vec<bool>>>()
            .ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Per layer: the layer whose KV it attends with. The last `shared_kv_layers` read the last
/// owning layer of their kind, as llama.cpp (which takes the one before last for sliding
/// layers and the last for global ones: refused if those are not of that kind).
pub fn kv_sources(m: &Meta, sliding: &[bool]) -> Result<Vec<usize>> {
    let n = sliding.len();
    let shared = m.usize("attention.shared_kv_layers").unwrap_or(0);
    let mut src: Vec<usize> = (0..n).collect();
    if shared == 0 {
        return Ok(src);
    }
    let owners = n
        .checked_sub(shared)
        .filter(|&o| o >= 2)
        .ok_or_else(|| EngineError::Unsupported(format!("{shared} shared-KV layers of {n}")))?;
    for (l, s) in src.iter_mut().enumerate().skip(owners) {
        *s = owners - if sliding[l] { 2 } else { 1 };
        if sliding[*s] != sliding[l] {
            return Err(EngineError::Unsupported(format!(
                "shared-KV layer {l} would read layer {s}, of the other kind",
                s = *s
            )));
        }
    }
    Ok(src)
}
