//! SmolLM3 (`smollm3`): Llama's layers, but every fourth layer (3, 7, 11, ...) attends without
//! RoPE.

use super::Features;

pub fn features(plain: Features) -> Features {
    Features {
        no_rope_every: Some(4),
        ..plain
    }
}
