//! Phi-3, Phi-3.5 and Phi-4-mini (`phi3`): Q, K and V in one matrix and gate and up in one
//! (split by rows at load, exactly), NEOX RoPE on the first `rope.dimension_count` dimensions
//! of each head only (Phi-4-mini: 96 of 128), and LongRoPE's per-frequency factors (the short
//! ones: this engine's contexts stay within the original length) and attention factor.

use super::RopeStyle;
use super::{Features, Meta};
use crate::{EngineError, Result};

pub fn features(plain: Features, m: &Meta, head_dim: usize) -> Result<Features> {
    let rope_dims = m.usize("rope.dimension_count").unwrap_or(head_dim);
    if rope_dims == 0 || rope_dims > head_dim || !rope_dims.is_multiple_of(2) {
        return Err(EngineError::Unsupported(format!(
            "RoPE on {rope_dims} of {head_dim} dimensions"
        )));
    }
    Ok(Features {
        rope_style: RopeStyle::Neox,
        fused: true,
        rope_dims,
        rope_attn_factor: m.f32("rope.scaling.attn_factor").unwrap_or(1.0),
        ..plain
    })
}
