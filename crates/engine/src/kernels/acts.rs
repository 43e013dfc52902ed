//! Activation rows quantized for the GEMM: i8 values with one f32 scale `d` per scale block
//! (32 values for the 32-block formats, 256 for the K formats, whose super blocks are then
//! summed in integers), `d * sum` per scale block (formats with a min), and the exact integer
//! sums of each 32-block and its halves (zero-point and min corrections). The values and
//! scales are those of `quantize_row_by` (the scalar path's), bit for bit; only the AVX2 GEMM
//! reads this form.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::QK;

#[derive(Default)]
pub(crate) struct Acts {
    /// 32-blocks per row.
    pub nb: usize,
    /// Scale blocks per row (`nb`, or `nb / 8` for 256-value scale blocks).
    pub ns: usize,
    /// i8 values per row in `q` (`nb * 32`).
    pub row_stride: usize,
    pub q: Vec<i8>,
    /// Per scale block.
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    /// Per 32-block.
    pub bsum: Vec<i32>,
    /// The two half-block sums as the i16 halves of one i32 (low: first half), for `madd`.
    pub hpair: Vec<i32>,
    /// The sums of 32-blocks `2p` and `2p + 1` as the i16 halves of one i32 (q4_K mins).
    pub bpair: Vec<i32>,
}

/// Where rows `i0..i0 + MT` start in each of `Acts`' arrays: what one GEMM tile reads.
pub(crate) struct TileRows<const MT: usize> {
    pub q: [*const i8; MT],
    /// Per scale block: `d` and `s`.
    pub d: [*const f32; MT],
    pub s: [*const f32; MT],
    /// Per 32-block: `bsum` and `hpair`; per pair of them: `bpair`.
    pub bsum: [*const i32; MT],
    pub hpair: [*const i32; MT],
    pub bpair: [*const i32; MT],
}

impl Acts {
    /// The tile pointers of rows `i0..i0 + MT` (computed only; reading them is the tile's
    /// business, within the rows `fill` made). Inlined so that a kernel computes only the
    /// pointers it reads: as a call it built all six arrays per tile (4 % of a decode step).
    #[inline(always)]
    pub fn rows<const MT: usize>(&self, i0: usize) -> TileRows<MT> {
        let (nb, ns) = (self.nb, self.ns);
        TileRows {
            q: std::array::from_fn(|i| self.q.as_ptr().wrapping_add((i0 + i) * self.row_stride)),
            d: std::array::from_fn(|i| self.d.as_ptr().wrapping_add((i0 + i) * ns)),
            s: std::array::from_fn(|i| self.s.as_ptr().wrapping_add((i0 + i) * ns)),
            bsum: std::array::from_fn(|i| self.bsum.as_ptr().wrapping_add((i0 + i) * nb)),
            hpair: std::array::from_fn(|i| self.hpair.as_ptr().wrapping_add((i0 + i) * nb)),
            bpair: std::array::from_fn(|i| self.bpair.as_ptr().wrapping_add((i0 + i) * nb / 2)),
        }
    }

    /// Quantizes `x` (`[m, k]`) with one scale per `width` values (32 or 256), reusing this
    /// value's buffers. Many rows are cut over the pool: each row is quantized by itself, so
    /// the cut changes no value (a batch-32 decode step spent ~5 % of its time here on the
    /// calling thread while the others waited).
    pub fn fill(&mut self, x: &[f32], m: usize, k: usize, width: usize) {
        let nb = k / QK;
        self.nb = nb;
        self.ns = k / width;
        self.row_stride = nb * QK;
        self.q.resize(m * nb * QK, 0);
        self.d.resize(m * self.ns, 0.0);
        self.s.resize(m * self.ns, 0.0);
        self.bsum.resize(m * nb, 0);
        self.hpair.resize(m * nb, 0);
        self.bpair.resize(m * nb.div_ceil(2), 0);
        assert!(super::LEVEL.avx2(), "Acts is the AVX2 GEMM's input");
        assert!(
            k >= width && k.is_multiple_of(width),
            "rows of whole scale blocks"
        );
        let x = &x[..m * k];
        let threads = rayon::current_num_threads();
        let tasks = if m * k >= PAR_MIN_VALUES {
            threads.min(m)
        } else {
            1
        };
        let per = m.div_ceil(tasks.max(1)).max(1);
        let ns = self.ns;
        let mut parts: Vec<RowsMut> = x
            .chunks((per * k).max(1))
            .zip(self.q.chunks_mut(per * nb * QK))
            .zip(self.d.chunks_mut(per * ns))
            .zip(self.s.chunks_mut(per * ns))
            .zip(self.bsum.chunks_mut(per * nb))
            .zip(self.hpair.chunks_mut(per * nb))
            .zip(self.bpair.chunks_mut((per * nb / 2).max(1)))
            .map(|((((((x, q), d), s), bsum), hpair), bpair)| RowsMut {
                x,
                q,
                d,
                s,
                bsum,
                hpair,
                bpair,
            })
            .collect();
        crate::par::each(&mut parts, 2, &|_, p| p.quantize(width));
    }
}

/// Below this many values `fill` stays on the calling thread (a pool call costs about a
/// microsecond, quantizing a 576-wide row about half of one).
const PAR_MIN_VALUES: usize = 8 * 1024;

/// Whole rows of `Acts`' arrays and their input: what one task of `fill` writes.
struct RowsMut<'a> {
    x: &'a [f32],
    q: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    bsum: &'a mut [i32],
    hpair: &'a mut [i32],
    bpair: &'a mut [i32],
}

impl RowsMut<'_> {
    fn quantize(&mut self, width: usize) {
        // SAFETY: AVX2 was detected (asserted in `fill`), AVX-512 F where `wide`; every
        // slice is whole 32-blocks.
        unsafe {
            if super::LEVEL.wide() {
                self.quantize_avx512(width)
            } else {
                self.quantize_avx2(width)
            }
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn quantize_avx2(&mut self, width: usize) {
        self.quantize_by::<false>(width)
    }

    #[target_feature(enable = "avx2,avx512f")]
    unsafe fn quantize_avx512(&mut self, width: usize) {
        self.quantize_by::<true>(width)
    }

    /// The rows' blocks on 8 or 16 (`WIDE`) lanes, inlined into the caller's features: as
    /// calls per 32-block the two kernels cost about as much as their work.
    #[inline(always)]
    unsafe fn quantize_by<const WIDE: bool>(&mut self, width: usize) {
        let per = width / QK;
        for sb in 0..self.d.len() {
            let xs = &self.x[sb * width..(sb + 1) * width];
            let amax = xs
                .chunks_exact(QK)
                .map(|b| if WIDE { amax16(b) } else { amax8(b) })
                .fold(0f32, f32::max);
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0;
            for (j, b) in xs.chunks_exact(QK).enumerate() {
                let at = sb * per + j;
                let q = &mut self.q[at * QK..(at + 1) * QK];
                let (h0, h1) = if WIDE {
                    quantize16(b, id, q)
                } else {
                    quantize8(b, id, q)
                };
                self.bsum[at] = h0 + h1;
                // |h| <= 16 * 127: both fit in i16.
                self.hpair[at] = (h0 & 0xFFFF) | (h1 << 16);
                sum += h0 + h1;
            }
            self.d[sb] = d;
            self.s[sb] = d * sum as f32;
        }
        if per > 1 {
            // |bsum| <= 32 * 127 fits in i16.
            for (p, pair) in self.bpair.iter_mut().enumerate() {
                *pair = (self.bsum[2 * p] & 0xFFFF) | (self.bsum[2 * p + 1] << 16);
            }
        }
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
    let r: [__m512i; 2] = std::array::from_fn(|i| {
        let y = _mm512_mul_ps(_mm512_loadu_ps(p.add(16 * i)), id);
        let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let fr = _mm512_abs_ps(_mm512_sub_ps(y, t));
        let step = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(y), sign), one);
        let ge = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(fr, half);
        let up = _mm512_castsi512_ps(_mm512_maskz_mov_epi32(ge, step));
        _mm512_cvtps_epi32(_mm512_add_ps(t, up))
    });
    _mm_storeu_si128(out as *mut __m128i, _mm512_cvtsepi32_epi8(r[0]));
    _mm_storeu_si128(out.add(16) as *mut __m128i, _mm512_cvtsepi32_epi8(r[1]));
    (_mm512_reduce_add_epi32(r[0]), _mm512_reduce_add_epi32(r[1]))
}

/// Largest |x| of one 32-block.
#[inline(always)]
unsafe fn amax8(xs: &[f32]) -> f32 {
    let p = xs.as_ptr();
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_and_ps(_mm256_loadu_ps(p.add(8 * i)), abs));
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
