//! Granite 3 (`granite`): Llama's layers with four multipliers: on the embeddings, on each
//! layer's attention and FFN output before the residual add, on the attention scores (in place
//! of 1/sqrt(head_dim)), and the logits divided by a scale.

use super::{Features, Meta};

pub fn features(plain: Features, m: &Meta) -> Features {
    let set = |k: &str| m.f32(k).filter(|&x| x != 0.0);
    Features {
        embed_scale: set("embedding_scale").unwrap_or(1.0),
        residual_scale: set("residual_scale").unwrap_or(1.0),
        attn_scale: set("attention.scale").unwrap_or(plain.attn_scale),
        logit_scale: set("logit_scale").map_or(1.0, |s| 1.0 / s),
        ..plain
    }
}
