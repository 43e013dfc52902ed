//! `delta.rs`'s step on 8 lanes (AVX2), four rows at a time so their sums' chains overlap: each
//! row's operations are the portable ones in the portable order (a multiply then an add, lane
//! `l` summing elements `l, l + 8, ...`, the lanes added pairwise), so the same bits.

use crate::kernels::delta::{lanes_sum, Step, LANES};

/// Rows together.
const ROWS: usize = 4;

/// Whole groups of `ROWS` rows of `m` when rows are a whole number of lanes; returns the rows
/// done (the caller runs the rest portably).
///
/// # Safety
/// AVX2 must be available.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn step_avx2(m: &mut [f32], s: &Step, o: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let d = s.k.len();
    if d == 0 || !d.is_multiple_of(LANES) {
        return 0;
    }
    let rows = m.len() / d;
    let groups = rows / ROWS;
    let decay = _mm256_set1_ps(s.decay);
    let (kp, qp) = (s.k.as_ptr(), s.q.as_ptr());
    for g in 0..groups {
        let base = m.as_mut_ptr().add(g * ROWS * d);
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for c in (0..d).step_by(LANES) {
            let k = _mm256_loadu_ps(kp.add(c));
            for (r, a) in acc.iter_mut().enumerate() {
                let p = base.add(r * d + c);
                let x = _mm256_mul_ps(_mm256_loadu_ps(p), decay);
                _mm256_storeu_ps(p, x);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, k));
            }
        }
        let mut delta = [_mm256_setzero_ps(); ROWS];
        for r in 0..ROWS {
            let j = g * ROWS + r;
            let sk = lanes_sum(lanes(acc[r]));
            delta[r] = _mm256_set1_ps((s.v[j] - sk) * s.beta);
        }
        let mut acc = [_mm256_setzero_ps(); ROWS];
        for c in (0..d).step_by(LANES) {
            let (k, q) = (_mm256_loadu_ps(kp.add(c)), _mm256_loadu_ps(qp.add(c)));
            for (r, a) in acc.iter_mut().enumerate() {
                let p = base.add(r * d + c);
                let x = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_mul_ps(k, delta[r]));
                _mm256_storeu_ps(p, x);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(x, q));
            }
        }
        for (r, a) in acc.iter().enumerate() {
            o[g * ROWS + r] = lanes_sum(lanes(*a)) * s.scale;
        }
    }
    groups * ROWS
}

#[target_feature(enable = "avx2")]
unsafe fn lanes(v: std::arch::x86_64::__m256) -> [f32; LANES] {
    let mut out = [0f32; LANES];
    std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}
