//! The scalar reference: the canonical score and the online-softmax step, one key at a time.
//! Every other kernel gives these bits.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::{State, BLOCK, MAX_HEAD_DIM};
use crate::kernels::exp::exp_neg;

/// The canonical score: sixteen lane sums (lane `i` the products of elements `i`, `i + 16`,
/// ... in order), added by a fixed tree. The first sixteen products start the lanes rather
/// than being added to zero: the same values (but for the sign of a zero product), and one
/// add in four fewer at 64-wide heads.
#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (mut ca, mut cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    if let (Some(x), Some(y)) = (ca.next(), cb.next()) {
        for i in 0..16 {
            lanes[i] = x[i] * y[i];
        }
    }
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            lanes[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
        lanes[i] += x * y;
    }
    // Fixed pairwise reduction order.
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
        w /= 2;
    }
    lanes[0]
}

/// The scalar reference: keys converted a block at a time, then consumed one by one.
pub(super) fn attend_impl(st: &mut State, q: &[f32], keys: &[f16], values: &[f16], n: usize) {
    attend_capped(st, q, keys, values, n, None)
}

/// `attend_impl` with each score soft-capped (`cap * tanh(s / cap)`, Gemma 2) when `cap` is
/// given: the path every capped attention takes, on every ISA, so the bits are one.
#[inline(always)]
pub(super) fn attend_capped(
    st: &mut State,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n: usize,
    cap: Option<f32>,
) {
    let d = st.dim;
    let mut kbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut vbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        let kb = &mut kbuf[..nb * d];
        keys[j0 * d..(j0 + nb) * d].convert_to_f32_slice(kb);
        let vb = &mut vbuf[..nb * d];
        values[j0 * d..(j0 + nb) * d].convert_to_f32_slice(vb);
        fold(st, q, kb, vb, nb, cap);
        j0 += nb;
    }
}

/// `n` f32 keys and values consumed one by one, scalar.
#[inline(always)]
pub(super) fn fold_scalar(st: &mut State, q: &[f32], kb: &[f32], vb: &[f32], n: usize) {
    fold(st, q, kb, vb, n, None)
}

/// `fold_scalar`, the scores soft-capped when `cap` is given.
#[inline(always)]
fn fold(st: &mut State, q: &[f32], kb: &[f32], vb: &[f32], n: usize, cap: Option<f32>) {
    let d = st.dim;
    let mut scores = [0f32; BLOCK];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        let (kb, vb) = (&kb[j0 * d..(j0 + nb) * d], &vb[j0 * d..(j0 + nb) * d]);
        for (s, k) in scores.iter_mut().zip(kb.chunks_exact(d)) {
            *s = dot(q, k);
        }
        if let Some(cap) = cap {
            for s in &mut scores[..nb] {
                *s = crate::kernels::softcap1(*s, cap);
            }
        }
        let acc = &mut st.acc[..d];
        for (&s, v) in scores[..nb].iter().zip(vb.chunks_exact(d)) {
            if s > st.m {
                let c = exp_neg(st.m - s);
                st.l *= c;
                for a in acc.iter_mut() {
                    *a *= c;
                }
                st.m = s;
            }
            let p = exp_neg(s - st.m);
            st.l += p;
            for (a, x) in acc.iter_mut().zip(v) {
                *a += p * x;
            }
        }
        j0 += nb;
    }
}
