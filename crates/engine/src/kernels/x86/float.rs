//! The float GEMM's tiles on AVX2 (two 8-lane vectors) and AVX-512 (one 16-lane vector): f16
//! widened by `vcvtph2ps`, bf16 by a 16-bit shift, both exact.

use std::arch::x86_64::*;

use half::{bf16, f16};

use crate::kernels::float_tile::{tiles, Elem, Lanes};

/// A float matrix value as the x86 paths read it.
pub(crate) trait Load: Elem {
    /// Sixteen values at `p` as f32 (AVX-512 F).
    unsafe fn l16(p: *const Self) -> __m512;
    /// Eight values at `p` as f32 (AVX2, F16C).
    unsafe fn l8(p: *const Self) -> __m256;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn l16(p: *const Self) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> __m256 {
        _mm256_loadu_ps(p)
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn l16(p: *const Self) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
}

impl Load for bf16 {
    #[inline(always)]
    unsafe fn l16(p: *const Self) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(p.cast()),
        )))
    }
    #[inline(always)]
    unsafe fn l8(p: *const Self) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(p.cast()),
        )))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct W512(__m512);

impl<E: Load> Lanes<E> for W512 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        W512(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn x(p: *const f32) -> Self {
        W512(_mm512_loadu_ps(p))
    }
    #[inline(always)]
    unsafe fn w(p: *const E) -> Self {
        W512(E::l16(p))
    }
    #[inline(always)]
    unsafe fn mul_add(acc: Self, a: Self, b: Self) -> Self {
        W512(_mm512_fmadd_ps(a.0, b.0, acc.0))
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; 16]) {
        _mm512_storeu_ps(out.as_mut_ptr(), self.0)
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
        sum8(_mm256_add_ps(_mm512_castps512_ps256(self.0), hi))
    }
}

#[derive(Clone, Copy)]
pub(crate) struct W256(__m256, __m256);

impl<E: Load> Lanes<E> for W256 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        W256(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn x(p: *const f32) -> Self {
        W256(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline(always)]
    unsafe fn w(p: *const E) -> Self {
        W256(E::l8(p), E::l8(p.add(8)))
    }
    #[inline(always)]
    unsafe fn mul_add(acc: Self, a: Self, b: Self) -> Self {
        W256(
            _mm256_fmadd_ps(a.0, b.0, acc.0),
            _mm256_fmadd_ps(a.1, b.1, acc.1),
        )
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; 16]) {
        _mm256_storeu_ps(out.as_mut_ptr(), self.0);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), self.1);
    }
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        sum8(_mm256_add_ps(self.0, self.1))
    }
}

/// Lanes 0-7 of `float::tree` after its first step: `i + 4`, `i + 2`, `i + 1` in that order.
#[inline(always)]
unsafe fn sum8(v: __m256) -> f32 {
    let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
    _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps::<1>(d, d)))
}

/// `float::block` on 512-bit vectors: tiles of 4 activation rows by 4 weight rows (16
/// accumulators of the 32 registers).
///
/// # Safety
/// AVX-512 F present; the slices as `float::block`'s.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn block512<E: Load>(
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    tiles::<W512, E, 4, 4>(w, cols, k, x, m, out)
}

/// `float::block` on 256-bit vectors: tiles of 3 activation rows by 2 weight rows (6
/// accumulator pairs of the 16 registers). Per 16 values a tile loads 10 vectors for 12 FMAs,
/// where 2 by 2 loaded 8 for 8: Zen 1's one 256-bit load a cycle had bound it (qwen05 f16
/// prefill +16-22 %; 2 by 3 measured the same as 3 by 2).
///
/// # Safety
/// AVX2, FMA and F16C present; the slices as `float::block`'s.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block256<E: Load>(
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    tiles::<W256, E, 3, 2>(w, cols, k, x, m, out)
}
