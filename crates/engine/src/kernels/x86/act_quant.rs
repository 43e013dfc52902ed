//! The x86 block quantizers of `Acts` (AVX2 on 8 lanes, AVX-512 on 16).

use std::arch::x86_64::*;

use crate::kernels::act_quant::{BlockQuant, RowsMut};
use crate::kernels::QK;

pub(in crate::kernels) fn quantize(rows: &mut RowsMut, width: usize) {
    // SAFETY: AVX2 was detected (`Acts::fill` asserts a SIMD level, and on x86 every one has
    // AVX2), AVX-512 F where `wide`; every slice is whole 32-blocks.
    unsafe {
        if crate::kernels::LEVEL.wide() {
            quantize_avx512(rows, width)
        } else {
            quantize_avx2(rows, width)
        }
    }
}

#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(rows: &mut RowsMut, width: usize) {
    rows.quantize_by::<Lanes8>(width)
}

#[target_feature(enable = "avx2,avx512f")]
unsafe fn quantize_avx512(rows: &mut RowsMut, width: usize) {
    rows.quantize_by::<Lanes16>(width)
}

struct Lanes8;
struct Lanes16;

impl BlockQuant for Lanes8 {
    #[inline(always)]
    unsafe fn amax(xs: &[f32]) -> f32 {
        amax8(xs)
    }
    #[inline(always)]
    unsafe fn quantize(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
        quantize8(xs, id, q)
    }
}

impl BlockQuant for Lanes16 {
    #[inline(always)]
    unsafe fn amax(xs: &[f32]) -> f32 {
        amax16(xs)
    }
    #[inline(always)]
    unsafe fn quantize(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
        quantize16(xs, id, q)
    }
}

/// Largest |x| of one 32-block, 16 lanes (max is exact, so any order gives its bits).
#[inline(always)]
unsafe fn amax16(xs: &[f32]) -> f32 {
    let p = xs[..QK].as_ptr();
    let m = _mm512_max_ps(
        _mm512_abs_ps(_mm512_loadu_ps(p)),
        _mm512_abs_ps(_mm512_loadu_ps(p.add(16))),
    );
    _mm512_reduce_max_ps(m)
}

/// `quantize8`'s operations on 16 lanes, then narrowed by saturation (the values are within
/// +-127 either way).
#[inline(always)]
unsafe fn quantize16(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
    let (p, out) = (xs[..QK].as_ptr(), q[..QK].as_mut_ptr());
    let id = _mm512_set1_ps(id);
    let sign = _mm512_set1_epi32(i32::MIN);
    let one = _mm512_castps_si512(_mm512_set1_ps(1.0));
    let half = _mm512_set1_ps(0.5);
    // Loops, not `from_fn`: a closure would not inherit the caller's target features (its
    // intrinsics would be calls).
    let mut r = [_mm512_setzero_si512(); 2];
    for (i, ri) in r.iter_mut().enumerate() {
        let y = _mm512_mul_ps(_mm512_loadu_ps(p.add(16 * i)), id);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let fr = _mm512_abs_ps(_mm512_sub_ps(y, t));
        let step = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one);
        let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(fr, half);
        let up = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(ge, step));
        *ri = _mm512_cvtps_epi32(_mm512_add_ps(t, up));
    }
    _mm_storeu_si128(out as *mut __m128i, _mm512_cvtsepi32_epi8(r[0]));
    _mm_storeu_si128(out.add(16) as *mut __m128i, _mm512_cvtsepi32_epi8(r[1]));
    (_mm512_reduce_add_epi32(r[0]), _mm512_reduce_add_epi32(r[1]))
}

/// Largest |x| of one 32-block.
#[inline(always)]
unsafe fn amax8(xs: &[f32]) -> f32 {
    let p = xs.as_ptr();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut v = [_mm256_setzero_ps(); 4];
    for (i, vi) in v.iter_mut().enumerate() {
        *vi = _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs);
    }
    let m = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)))
}

/// One 32-block `round(x * id)` into `q`; returns the sums of its two halves.
#[inline(always)]
unsafe fn quantize8(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
    let p = xs.as_ptr();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let id = _mm256_set1_ps(id);
    let sign = _mm256_set1_ps(-0.0);
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    // Round half away from zero, as f32::round: truncate, then step away where the (exact)
    // fraction is at least one half.
    let mut r = [_mm256_setzero_si256(); 4];
    for (i, ri) in r.iter_mut().enumerate() {
        let y = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * i)), id);
        let t = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        let fr = _mm256_and_ps(_mm256_sub_ps(y, t), abs);
        let step = _mm256_or_ps(_mm256_and_ps(y, sign), one);
        let up = _mm256_and_ps(_mm256_cmp_ps(fr, half, _CMP_GE_OQ), step);
        *ri = _mm256_cvtps_epi32(_mm256_add_ps(t, up));
    }
    let p16a = _mm256_packs_epi32(r[0], r[1]);
    let p16b = _mm256_packs_epi32(r[2], r[3]);
    let p8 = _mm256_packs_epi16(p16a, p16b);
    let ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered);
    (sum16(r[0], r[1]), sum16(r[2], r[3]))
}

/// Sum of the 16 i32 lanes of `a` and `c`.
#[inline(always)]
unsafe fn sum16(a: __m256i, c: __m256i) -> i32 {
    let s = _mm256_add_epi32(a, c);
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 1)
}
