//! The aarch64 attention kernel: Advanced SIMD (`neon.rs`).

pub(super) mod neon;
