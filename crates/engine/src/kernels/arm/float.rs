//! The float GEMM's tiles on Advanced SIMD (four 4-lane vectors): f16 widened by `fcvtl`,
//! bf16 by a 16-bit shift, both exact.

use std::arch::aarch64::*;

use half::{bf16, f16};

use super::gemm::half8;
use crate::kernels::float_tile::{tiles, Elem, Lanes};

/// A float matrix value as the aarch64 paths read it.
pub(crate) trait Load: Elem {
    /// Eight values at `p` as f32.
    unsafe fn l8(p: *const Self) -> [float32x4_t; 2];
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> [float32x4_t; 2] {
        [vld1q_f32(p), vld1q_f32(p.add(4))]
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> [float32x4_t; 2] {
        half8(p.cast())
    }
}

impl Load for bf16 {
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> [float32x4_t; 2] {
        let h = vld1q_u16(p.cast());
        [
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
            vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_high_u16(h))),
        ]
    }
}

#[derive(Clone, Copy)]
pub(crate) struct N16([float32x4_t; 4]);

impl<E: Load> Lanes<E> for N16 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        N16([vdupq_n_f32(0.0); 4])
    }
    #[inline(always)]
    unsafe fn x(p: *const f32) -> Self {
        N16([
            vld1q_f32(p),
            vld1q_f32(p.add(4)),
            vld1q_f32(p.add(8)),
            vld1q_f32(p.add(12)),
        ])
    }
    #[inline(always)]
    unsafe fn w(p: *const E) -> Self {
        let ([a, b], [c, d]) = (E::l8(p), E::l8(p.add(8)));
        N16([a, b, c, d])
    }
    #[inline(always)]
    unsafe fn mul_add(acc: Self, a: Self, b: Self) -> Self {
        N16(std::array::from_fn(|i| vfmaq_f32(acc.0[i], a.0[i], b.0[i])))
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; 16]) {
        for (i, v) in self.0.iter().enumerate() {
            vst1q_f32(out.as_mut_ptr().add(4 * i), *v);
        }
    }
}

/// `float::block` by tiles of 2 activation rows by 2 weight rows (16 accumulators of the 32
/// registers).
///
/// # Safety
/// The slices as `float::block`'s.
pub(crate) unsafe fn block<E: Load>(
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    tiles::<N16, E, 2, 2>(w, cols, k, x, m, out)
}
