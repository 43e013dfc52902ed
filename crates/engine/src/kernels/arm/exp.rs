//! `exp_neg` on 4 lanes of Advanced SIMD: the scalar function's operations lane-wise, so its
//! bits.

use crate::kernels::exp::{LN2_HI, LN2_LO, LOG2E, MIN_ARG, P};

/// `exp_neg` of 4 lanes: `exp_neg8`'s operations on Advanced SIMD (floor by `frintm`, the
/// out-of-range lanes cleared by mask), so the same bits.
///
/// # Safety
/// Advanced SIMD present (every aarch64 Linux target).
#[inline(always)]
pub unsafe fn exp_neg4(x: std::arch::aarch64::float32x4_t) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;
    let ok = vcgeq_f32(x, vdupq_n_f32(MIN_ARG));
    let x = vmaxq_f32(x, vdupq_n_f32(MIN_ARG));
    let n = vrndmq_f32(vaddq_f32(
        vmulq_f32(x, vdupq_n_f32(LOG2E)),
        vdupq_n_f32(0.5),
    ));
    let r = vsubq_f32(
        vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(LN2_HI))),
        vmulq_f32(n, vdupq_n_f32(LN2_LO)),
    );
    let mut p = vdupq_n_f32(P[0]);
    for c in &P[1..] {
        p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(*c));
    }
    let y = vaddq_f32(
        vaddq_f32(vmulq_f32(p, vmulq_f32(r, r)), r),
        vdupq_n_f32(1.0),
    );
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let v = vmulq_f32(y, vreinterpretq_f32_s32(e));
    vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), ok))
}
