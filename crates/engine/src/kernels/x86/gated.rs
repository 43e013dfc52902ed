//! The gated activations on 8 (AVX2) and 16 (AVX-512) lanes: `gated.rs`'s operations
//! lane-wise, so its bits.

use super::exp::{exp_neg16, exp_neg8};
use crate::kernels::gated::{GELU_A, GELU_B};

#[target_feature(enable = "avx2")]
pub(crate) unsafe fn gated_mul_avx2<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 8 * 8;
    let sign = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let (a, b) = (_mm256_set1_ps(GELU_A), _mm256_set1_ps(GELU_B));
    for i in (0..n).step_by(8) {
        let x = _mm256_loadu_ps(g.as_ptr().add(i));
        let z = if GELU {
            _mm256_mul_ps(x, _mm256_add_ps(a, _mm256_mul_ps(b, _mm256_mul_ps(x, x))))
        } else {
            x
        };
        let e = exp_neg8(_mm256_or_ps(z, sign));
        let neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
        let num = _mm256_blendv_ps(one, e, neg);
        let s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        let y = _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u.as_ptr().add(i)));
        _mm256_storeu_ps(g.as_mut_ptr().add(i), y);
    }
    n
}

/// `gated_mul_avx2`'s operations on 16 lanes (floor by rounding down, the blend by mask):
/// the same bits, half the instructions.
#[target_feature(enable = "avx2,avx512f")]
pub(crate) unsafe fn gated_mul_avx512<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 16 * 16;
    let sign = _mm512_castsi512_ps(_mm512_set1_epi32(i32::MIN));
    let one = _mm512_set1_ps(1.0);
    let (a, b) = (_mm512_set1_ps(GELU_A), _mm512_set1_ps(GELU_B));
    for i in (0..n).step_by(16) {
        let x = _mm512_loadu_ps(g.as_ptr().add(i));
        let z = if GELU {
            _mm512_mul_ps(x, _mm512_add_ps(a, _mm512_mul_ps(b, _mm512_mul_ps(x, x))))
        } else {
            x
        };
        let e = exp_neg16(_mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(z),
            _mm512_castps_si512(sign),
        )));
        let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps());
        let num = _mm512_mask_blend_ps(neg, one, e);
        let s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        let y = _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_loadu_ps(u.as_ptr().add(i)));
        _mm512_storeu_ps(g.as_mut_ptr().add(i), y);
    }
    n
}
