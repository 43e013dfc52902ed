//! The Advanced SIMD block quantizer of `Acts`: 4 lanes, `fcvtas` rounding half away from
//! zero as `f32::round` does, so the scalar rows' bits.

use std::arch::aarch64::*;

use crate::kernels::act_quant::{BlockQuant, RowsMut};
use crate::kernels::QK;

pub(in crate::kernels) fn quantize(rows: &mut RowsMut, width: usize) {
    // SAFETY: Advanced SIMD is part of every aarch64 Linux target; every slice is whole
    // 32-blocks.
    unsafe { quantize_neon(rows, width) }
}

#[target_feature(enable = "neon")]
unsafe fn quantize_neon(rows: &mut RowsMut, width: usize) {
    rows.quantize_by::<Lanes4>(width)
}

struct Lanes4;

impl BlockQuant for Lanes4 {
    /// Largest |x| of one 32-block (max is exact, so any order gives its bits; `fmaxnm`
    /// ignores NaN as `f32::max` does).
    #[inline(always)]
    unsafe fn amax(xs: &[f32]) -> f32 {
        let p = xs[..QK].as_ptr();
        let v: [float32x4_t; 8] = std::array::from_fn(|i| vabsq_f32(vld1q_f32(p.add(4 * i))));
        let m = vmaxnmq_f32(
            vmaxnmq_f32(vmaxnmq_f32(v[0], v[1]), vmaxnmq_f32(v[2], v[3])),
            vmaxnmq_f32(vmaxnmq_f32(v[4], v[5]), vmaxnmq_f32(v[6], v[7])),
        );
        vmaxnmvq_f32(m)
    }

    #[inline(always)]
    unsafe fn quantize(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
        let (p, out) = (xs[..QK].as_ptr(), q[..QK].as_mut_ptr());
        let id = vdupq_n_f32(id);
        let r: [int32x4_t; 8] =
            std::array::from_fn(|i| vcvtaq_s32_f32(vmulq_f32(vld1q_f32(p.add(4 * i)), id)));
        // |r| <= 127: the saturating narrows change nothing.
        for h in 0..2 {
            let r = &r[4 * h..];
            let a = vcombine_s16(vqmovn_s32(r[0]), vqmovn_s32(r[1]));
            let b = vcombine_s16(vqmovn_s32(r[2]), vqmovn_s32(r[3]));
            vst1q_s8(out.add(16 * h), vcombine_s8(vqmovn_s16(a), vqmovn_s16(b)));
        }
        let sum =
            |r: &[int32x4_t]| vaddvq_s32(vaddq_s32(vaddq_s32(r[0], r[1]), vaddq_s32(r[2], r[3])));
        (sum(&r[..4]), sum(&r[4..]))
    }
}
