//! Activation rows quantized for the GEMM: per 32-block i8 values, the f32 scale `d`,
//! `d * sum` (for formats with a min) and the exact integer sums of the block and its halves
//! (zero-point corrections). The values and scales are those of `quantize_row` (the scalar
//! path's), bit for bit; only the AVX2 GEMM reads this form.

#![cfg(target_arch = "x86_64")]

use super::QK;

#[derive(Default)]
pub(crate) struct Acts {
    /// 32-blocks per row.
    pub nb: usize,
    /// i8 values per row in `q` (`nb * 32`).
    pub row_stride: usize,
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    pub bsum: Vec<i32>,
    /// The two half-block sums as the i16 halves of one i32 (low: first half), for `madd`.
    pub hpair: Vec<i32>,
}

impl Acts {
    /// Quantizes `x` (`[m, k]`), reusing this value's buffers.
    pub fn fill(&mut self, x: &[f32], m: usize, k: usize) {
        let nb = k / QK;
        self.nb = nb;
        self.row_stride = nb * QK;
        self.q.resize(m * nb * QK, 0);
        self.d.resize(m * nb, 0.0);
        self.s.resize(m * nb, 0.0);
        self.bsum.resize(m * nb, 0);
        self.hpair.resize(m * nb, 0);
        assert_eq!(
            *super::LEVEL,
            super::Level::Avx2,
            "Acts is the AVX2 GEMM's input"
        );
        for b in 0..m * nb {
            // SAFETY: AVX2 was detected (asserted above); every slice is a whole block.
            unsafe { self.block_avx2(&x[b * QK..(b + 1) * QK], b) };
        }
    }

    #[inline(always)]
    fn store(&mut self, b: usize, d: f32, h0: i32, h1: i32) {
        self.d[b] = d;
        self.s[b] = d * (h0 + h1) as f32;
        self.bsum[b] = h0 + h1;
        // |h| <= 16 * 127: both fit in i16.
        self.hpair[b] = (h0 & 0xFFFF) | (h1 << 16);
    }

    #[target_feature(enable = "avx2")]
    unsafe fn block_avx2(&mut self, xs: &[f32], b: usize) {
        use std::arch::x86_64::*;
        let p = xs.as_ptr();
        let mut v = [_mm256_setzero_ps(); 4];
        for (i, vi) in v.iter_mut().enumerate() {
            *vi = _mm256_loadu_ps(p.add(8 * i));
        }
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
        let m = _mm256_max_ps(
            _mm256_max_ps(_mm256_and_ps(v[0], abs), _mm256_and_ps(v[1], abs)),
            _mm256_max_ps(_mm256_and_ps(v[2], abs), _mm256_and_ps(v[3], abs)),
        );
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1));
        let amax = _mm_cvtss_f32(m1);
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let sign = _mm256_set1_ps(-0.0);
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        // Round half away from zero, as f32::round: truncate, then step away where the
        // (exact) fraction is at least one half.
        // (Plain loops: closures would not inherit this function's target features.)
        let mut r = [_mm256_setzero_si256(); 4];
        for (ri, vi) in r.iter_mut().zip(v) {
            let y = _mm256_mul_ps(vi, id);
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
        _mm256_storeu_si256(self.q.as_mut_ptr().add(b * QK) as *mut __m256i, ordered);
        let (h0, h1) = (sum16(r[0], r[1]), sum16(r[2], r[3]));
        self.store(b, d, h0, h1);
    }
}

/// Sum of the 16 i32 lanes of `a` and `c`.
#[inline(always)]
unsafe fn sum16(a: std::arch::x86_64::__m256i, c: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s = _mm256_add_epi32(a, c);
    let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 1)
}
