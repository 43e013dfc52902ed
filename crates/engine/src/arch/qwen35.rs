//! Qwen3.5 (`qwen35`): a hybrid. Most layers are Gated DeltaNet (linear attention: a fixed-size
//! recurrent state per head, no KV; `recurrent.rs`), every `full_attention_interval`-th is a
//! gated full-attention layer: Q projected twice as wide, its second half per head a sigmoid
//! gate on the attention output, per-head RMS norms of Q and K, NEOX RoPE on the first
//! `rope.dimension_count` dimensions (the text positions of its interleaved multi-axis RoPE).
//! The norm before the FFN is named `post_attention_norm`. MTP (next-n) blocks at the end of
//! the file are left unread. Qwen3.5-MoE (`qwen35moe`) is the same trunk with routed experts
//! and a gated shared expert for FFN.

use super::RopeStyle;
use super::{Features, Meta};
use crate::gguf::Value;
use crate::recurrent::{DeltaNet, Recurrence};
use crate::{EngineError, Result};

/// Widest convolution and head this engine accepts (Qwen3.5: 4 and 128), so a state's size is
/// bounded before it is allocated.
const MAX_CONV_KERNEL: usize = 16;
const MAX_STATE_HEAD: usize = 256;
const MAX_STATE_HEADS: usize = 256;

pub fn features(plain: Features, m: &Meta, head_dim: usize) -> Result<Features> {
    let rope_dims = m.usize("rope.dimension_count").unwrap_or(head_dim);
    if rope_dims == 0 || rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
        return Err(EngineError::Unsupported(format!(
            "RoPE on {rope_dims} of {head_dim} dimensions"
        )));
    }
    text_positions_only(m, rope_dims)?;
    let inner = m.usize("ssm.inner_size")?;
    let v_heads = m.usize("ssm.time_step_rank")?;
    let shape = DeltaNet {
        conv_kernel: m.usize("ssm.conv_kernel")?,
        k_heads: m.usize("ssm.group_count")?,
        v_heads,
        head_dim: m.usize("ssm.state_size")?,
    };
    let ok = (2..=MAX_CONV_KERNEL).contains(&shape.conv_kernel)
        && (1..=MAX_STATE_HEAD).contains(&shape.head_dim)
        && (1..=MAX_STATE_HEADS).contains(&v_heads)
        && shape.k_heads > 0
        && v_heads.is_multiple_of(shape.k_heads)
        && inner == v_heads * shape.head_dim;
    if !ok {
        return Err(EngineError::Unsupported(format!(
            "DeltaNet of {} key heads, {v_heads} value heads of {} (inner {inner}), convolution {}",
            shape.k_heads, shape.head_dim, shape.conv_kernel
        )));
    }
    Ok(Features {
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        attn_gate: true,
        rope_dims,
        ffn_norm: "post_attention_norm",
        recurrence: Some(Recurrence::DeltaNet(shape)),
        ..plain
    })
}

/// Qwen3.5-MoE: the hybrid trunk, a softmax router over experts, and (when the file holds its
/// tensors) a shared expert whose output a sigmoid of the row scales.
pub fn moe(plain: Features, m: &Meta, head_dim: usize) -> Result<Features> {
    let shared_n_ff = if m.has("blk.0.ffn_up_shexp.weight") {
        Some(
            m.usize("expert_shared_feed_forward_length")
                .or_else(|_| m.usize("feed_forward_length"))?,
        )
    } else {
        None
    };
    Ok(Features {
        moe: Some(super::qwen::experts(m, shared_n_ff)?),
        ..features(plain, m, head_dim)?
    })
}

/// Per layer (of the first `n_layer`): whether it is a DeltaNet layer. The GGUF's explicit
/// list, else every `full_attention_interval`-th layer (default 4) attends.
pub fn recurrent_layers(m: &Meta, n_layer: usize) -> Result<Vec<bool>> {
    if let Some(Value::Array(v)) = m.content.metadata.get(&m.key("attention.recurrent_layers")) {
        let flags: Option<Vec<bool>> = v
            .iter()
            .take(n_layer)
            .map(|x| match x {
                Value::Bool(b) => Some(*b),
                other => other.to_u32().map(|n| n != 0),
            })
            .collect();
        return match flags {
            Some(f) if f.len() == n_layer => Ok(f),
            _ => Err(EngineError::Gguf(
                "attention.recurrent_layers: not one flag per layer".into(),
            )),
        };
    }
    let every = m.usize("full_attention_interval").unwrap_or(4);
    if every == 0 {
        return Err(EngineError::Gguf("full_attention_interval is 0".into()));
    }
    Ok((0..n_layer)
        .map(|l| !(l + 1).is_multiple_of(every))
        .collect())
}

/// The rope sections (`rope.dimension_sections`, interleaved as llama.cpp's IMROPE) must give
/// every rotated pair a text axis (time, height or width: all the token's position): a pair on
/// the fourth axis would rotate by position 0, which this engine does not model.
fn text_positions_only(m: &Meta, rope_dims: usize) -> Result<()> {
    let Some(Value::Array(v)) = m.content.metadata.get(&m.key("rope.dimension_sections")) else {
        return Ok(());
    };
    let s: Vec<usize> = v
        .iter()
        .filter_map(|x| x.to_u32())
        .map(|x| x as usize)
        .collect();
    let total: usize = s.iter().sum();
    let text = |sector: usize| {
        (0..3).any(|axis| sector % 3 == axis && sector < 3 * s.get(axis).copied().unwrap_or(0))
    };
    let ok = s.len() == v.len() && total > 0 && (0..rope_dims / 2).all(|i| text(i % total));
    if !ok {
        return Err(EngineError::Unsupported(format!(
            "rope sections {s:?} over {rope_dims} dimensions: a pair off the text axes"
        )));
    }
    Ok(())
}
