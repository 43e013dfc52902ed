//! LFM2 (`lfm2`): a hybrid of short convolutions and attention. A layer whose KV head count is
//! 0 in the GGUF's per-layer list is a short convolution (`recurrent.rs`: B, C and X projected
//! from the row, `C * conv(B * X)` over `shortconv.l_cache` taps, its window the state); the
//! others are GQA with per-head Q/K RMS norms and NEOX RoPE. The norm before the head is named
//! `token_embd_norm`.

use super::RopeStyle;
use super::{Features, Meta};
use crate::recurrent::{Recurrence, ShortConv};
use crate::{EngineError, Result};

/// Widest convolution this engine accepts (LFM2: 3).
const MAX_CONV_KERNEL: usize = 16;

pub fn features(plain: Features, m: &Meta, n_embd: usize) -> Result<Features> {
    let kernel = m.usize("shortconv.l_cache")?;
    if !(2..=MAX_CONV_KERNEL).contains(&kernel) {
        return Err(EngineError::Unsupported(format!(
            "short convolution of {kernel} taps"
        )));
    }
    // llama.cpp then runs every attention layer through a sliding window; not modelled here.
    if m.usize("attention.sliding_window").is_ok_and(|w| w > 0) {
        return Err(EngineError::Unsupported(
            "LFM2 with sliding-window attention".into(),
        ));
    }
    Ok(Features {
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        output_norm: "token_embd_norm",
        recurrence: Some(Recurrence::ShortConv(ShortConv {
            kernel,
            width: n_embd,
        })),
        ..plain
    })
}

/// Per layer (of the first `n_layer`): whether it is a short convolution, from the per-layer
/// KV head counts (0: no attention).
pub fn recurrent_layers(m: &Meta, n_layer: usize) -> Result<Vec<bool>> {
    let kv = m.counts("attention.head_count_kv")?;
    match kv {
        Some(v) if v.len() >= n_layer => Ok(v[..n_layer].iter().map(|&h| h == 0).collect()),
        _ => Err(EngineError::Gguf(
            "attention.head_count_kv: not one count per layer".into(),
        )),
    }
}
