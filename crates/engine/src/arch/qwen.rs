//! Qwen2 (`qwen2`: biases on Q, K, V), Qwen3 (`qwen3`: per-head RMS norms of Q and K, no
//! biases) and Qwen3-MoE (`qwen3moe`: Qwen3's attention, a routed mixture of experts for FFN).
//! All rotate in the NEOX layout (dimension i with i + d/2).

use super::RopeStyle;
use super::{Features, Meta, Moe};
use crate::{EngineError, Result};

pub fn qwen2(plain: Features) -> Features {
    Features {
        rope_style: RopeStyle::Neox,
        qkv_bias: true,
        ..plain
    }
}

pub fn qwen3(plain: Features) -> Features {
    Features {
        rope_style: RopeStyle::Neox,
        qk_norm: true,
        ..plain
    }
}

pub fn qwen3moe(plain: Features, m: &Meta) -> Result<Features> {
    Ok(Features {
        moe: Some(experts(m, None)?),
        ..qwen3(plain)
    })
}

/// The experts of a Qwen MoE family's layers, and the width of its shared expert if it has one.
pub fn experts(m: &Meta, shared_n_ff: Option<usize>) -> Result<Moe> {
    let moe = Moe {
        count: m.usize("expert_count")?,
        used: m.usize("expert_used_count")?,
        n_ff: m.usize("expert_feed_forward_length")?,
        shared_n_ff,
    };
    if moe.used == 0 || moe.used > moe.count || moe.count > 1024 {
        return Err(EngineError::Unsupported(format!(
            "{} of {} experts per token",
            moe.used, moe.count
        )));
    }
    Ok(moe)
}
