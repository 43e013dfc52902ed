//! Gemma 2 (`gemma2`) and Gemma 3 (`gemma3`): embeddings scaled by sqrt(width), norms after the
//! attention and the FFN as well as before, GELU, NEOX RoPE, and sliding-window layers between
//! global ones (Gemma 2: every other layer; Gemma 3: five in six, with per-head norms of Q and
//! K and their own RoPE base). Gemma 2 soft-caps the attention scores and the logits.

use super::RopeStyle;
use super::{Features, Meta};

fn gemma(plain: Features, n_embd: usize) -> Features {
    Features {
        rope_style: RopeStyle::Neox,
        post_norms: true,
        gelu: true,
        embed_scale: (n_embd as f32).sqrt(),
        ..plain
    }
}

pub fn gemma2(plain: Features, m: &Meta, n_embd: usize) -> Features {
    let n_head = m.usize("attention.head_count").unwrap_or(1).max(1);
    // The 27B model (46 layers) scales by the width per head, the others by the head size.
    let attn_scale = match m.usize("block_count") {
        Ok(46) => 1.0 / ((n_embd / n_head) as f32).sqrt(),
        _ => plain.attn_scale,
    };
    Features {
        attn_softcap: Some(m.f32("attn_logit_softcapping").unwrap_or(50.0)),
        final_softcap: Some(m.f32("final_logit_softcapping").unwrap_or(30.0)),
        window_pattern: 2,
        attn_scale,
        ..gemma(plain, n_embd)
    }
}

pub fn gemma3(plain: Features, n_embd: usize) -> Features {
    Features {
        qk_norm: true,
        window_pattern: 6,
        window_rope_base: Some(10_000.0),
        ..gemma(plain, n_embd)
    }
}
