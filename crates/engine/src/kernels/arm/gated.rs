//! The gated activations on 4 lanes of Advanced SIMD: `gated.rs`'s operations lane-wise, so
//! its bits.

use super::exp::exp_neg4;
use crate::kernels::gated::{GELU_A, GELU_B};

/// `gated_mul_avx2`'s operations on 4 lanes of Advanced SIMD: the same bits.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn gated_mul_neon<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::aarch64::*;
    let n = g.len() / 4 * 4;
    let one = vdupq_n_f32(1.0);
    let (a, b) = (vdupq_n_f32(GELU_A), vdupq_n_f32(GELU_B));
    for i in (0..n).step_by(4) {
        let x = vld1q_f32(g.as_ptr().add(i));
        let z = if GELU {
            vmulq_f32(x, vaddq_f32(a, vmulq_f32(b, vmulq_f32(x, x))))
        } else {
            x
        };
        // -|z|: the sign bit set.
        let e = exp_neg4(vnegq_f32(vabsq_f32(z)));
        let neg = vcltq_f32(z, vdupq_n_f32(0.0));
        let num = vbslq_f32(neg, e, one);
        let s = vdivq_f32(num, vaddq_f32(one, e));
        let y = vmulq_f32(vmulq_f32(x, s), vld1q_f32(u.as_ptr().add(i)));
        vst1q_f32(g.as_mut_ptr().add(i), y);
    }
    n
}
