//! The canonical scalar block dot: the reference every SIMD path matches bit for bit (see
//! mod.rs), on GGUF rows unpacked one by one.

use super::{Format, QuantRow, Unpacked, QK};

/// Block `b`'s float contribution given its exact integer dot product.
#[inline(always)]
fn block_term(w: &Unpacked, a: &QuantRow, b: usize, isum: i32, has_min: bool) -> f32 {
    let t = (w.d[b] * a.d[b]) * isum as f32;
    if has_min {
        t + w.m[b] * a.s[b]
    } else {
        t
    }
}

#[inline(always)]
fn reduce(lanes: &[f32; 8]) -> f32 {
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
}

/// Exact integer dot of half block `h` (16 values) of 32-block `b`.
#[inline(always)]
fn half(w: &Unpacked, a: &QuantRow, b: usize, h: usize) -> i32 {
    let r = b * QK + h * 16..b * QK + (h + 1) * 16;
    w.q[r.clone()]
        .iter()
        .zip(&a.q[r])
        .map(|(&x, &y)| x as i32 * y as i32)
        .sum()
}

/// The canonical dot of one weight row and one activation row (`a` quantized with
/// `f.act_block()`): one float term per scale block into lane `term % 8`, lanes reduced by a
/// fixed tree.
pub(super) fn dot_scalar(w: &Unpacked, a: &QuantRow, f: Format) -> f32 {
    let mut lanes = [0f32; 8];
    if f.is_k() {
        // Per super block: the scaled block dots and the mins' correction, both exact i32.
        let per = f.block_values() / QK;
        for s in 0..w.nb / per {
            let (mut isum, mut msum) = (0i32, 0i32);
            for b in s * per..(s + 1) * per {
                isum += w.sc[2 * b] * half(w, a, b, 0) + w.sc[2 * b + 1] * half(w, a, b, 1);
                let bsum: i32 = a.q[b * QK..(b + 1) * QK].iter().map(|&q| q as i32).sum();
                msum += w.mi[b] * bsum;
            }
            let b0 = s * per;
            let mut t = (w.d[b0] * a.d[s]) * isum as f32;
            if f.has_min() {
                t += (w.m[b0] * a.d[s]) * msum as f32;
            }
            lanes[s % 8] += t;
        }
        return reduce(&lanes);
    }
    for b in 0..w.nb {
        let isum = half(w, a, b, 0) + half(w, a, b, 1);
        lanes[b % 8] += block_term(w, a, b, isum, f.has_min());
    }
    reduce(&lanes)
}
