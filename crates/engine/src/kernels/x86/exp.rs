//! `exp_neg` on 8 (AVX2) and 16 (AVX-512) lanes: the scalar function's operations lane-wise,
//! so its bits.

use crate::kernels::exp::{LN2_HI, LN2_LO, LOG2E, MIN_ARG, P};

/// `exp_neg` of 8 lanes.
///
/// # Safety
/// AVX2 present.
#[inline(always)]
pub unsafe fn exp_neg8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let ok = _mm256_cmp_ps(x, _mm256_set1_ps(MIN_ARG), _CMP_GE_OQ);
    let x = _mm256_max_ps(x, _mm256_set1_ps(MIN_ARG));
    let n = _mm256_floor_ps(_mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
    );
    let mut p = _mm256_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), ok)
}

/// `exp_neg` of 16 lanes: `exp_neg8`'s operations on 512-bit vectors (floor by rounding
/// down, the out-of-range lanes zeroed by mask), so the same bits.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
pub unsafe fn exp_neg16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let ok = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(MIN_ARG));
    let x = _mm512_max_ps(x, _mm512_set1_ps(MIN_ARG));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut p = _mm512_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(*c));
    }
    let y = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
        _mm512_set1_ps(1.0),
    );
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvttps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)))
}
