//! The x86 attention kernels: 256-bit (`avx2.rs`) and AVX-512 (`few.rs`, `wide.rs`).

pub(super) mod avx2;
pub(super) mod few;
pub(super) mod wide;
