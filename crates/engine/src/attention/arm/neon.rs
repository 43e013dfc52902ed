//! One query's attention on Advanced SIMD: `fold_scalar`'s arithmetic with the 16 dot lanes
//! as four vectors (the same products, the same reduction tree, no fused multiply-add) and
//! the value rows scaled and added four lanes at a time, so the scalar path's bits. Keys and
//! values are widened from f16 a block at a time by `fcvtl`.

use std::arch::aarch64::*;
use std::arch::asm;

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::attention::{State, BLOCK, MAX_HEAD_DIM};
use crate::kernels::exp::exp_neg;

/// Whether this state's head size takes this path (whole sixteens, at least one).
pub(in crate::attention) fn usable(st: &State) -> bool {
    crate::kernels::LEVEL.neon() && st.dim >= 16 && st.dim.is_multiple_of(16)
}

/// `attend_impl` on Advanced SIMD.
///
/// # Safety
/// Advanced SIMD present; `usable(st)`; `keys` and `values` hold `n` rows of `st.dim`.
#[target_feature(enable = "neon")]
pub(in crate::attention) unsafe fn attend(
    st: &mut State,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n: usize,
) {
    let d = st.dim;
    let mut kbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut vbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        widen(&keys[j0 * d..(j0 + nb) * d], &mut kbuf[..nb * d]);
        widen(&values[j0 * d..(j0 + nb) * d], &mut vbuf[..nb * d]);
        fold(st, q, &kbuf[..nb * d], &vbuf[..nb * d], nb);
        j0 += nb;
    }
}

/// `fold_scalar` on Advanced SIMD.
///
/// # Safety
/// As `attend`, the keys and values in f32.
#[target_feature(enable = "neon")]
pub(in crate::attention) unsafe fn fold(
    st: &mut State,
    q: &[f32],
    kb: &[f32],
    vb: &[f32],
    n: usize,
) {
    let d = st.dim;
    assert!(kb.len() >= n * d && vb.len() >= n * d && q.len() >= d);
    let mut scores = [0f32; BLOCK];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        for (j, s) in scores[..nb].iter_mut().enumerate() {
            *s = dot(q.as_ptr(), kb.as_ptr().add((j0 + j) * d), d);
        }
        let acc = st.acc.as_mut_ptr();
        for (j, &s) in scores[..nb].iter().enumerate() {
            if s > st.m {
                let c = exp_neg(st.m - s);
                st.l *= c;
                let c = vdupq_n_f32(c);
                for i in (0..d).step_by(4) {
                    vst1q_f32(acc.add(i), vmulq_f32(vld1q_f32(acc.add(i)), c));
                }
                st.m = s;
            }
            let p = exp_neg(s - st.m);
            st.l += p;
            let (pv, v) = (vdupq_n_f32(p), vb.as_ptr().add((j0 + j) * d));
            for i in (0..d).step_by(4) {
                let x = vmulq_f32(pv, vld1q_f32(v.add(i)));
                vst1q_f32(acc.add(i), vaddq_f32(vld1q_f32(acc.add(i)), x));
            }
        }
        j0 += nb;
    }
}

/// The canonical score (`dot` in scalar.rs) of `d` values, `d` a multiple of 16: lane
/// vector `t` holds lanes `4t..4t + 4`.
#[inline(always)]
unsafe fn dot(a: *const f32, b: *const f32, d: usize) -> f32 {
    let mut l: [float32x4_t; 4] =
        std::array::from_fn(|t| vmulq_f32(vld1q_f32(a.add(4 * t)), vld1q_f32(b.add(4 * t))));
    for c in (16..d).step_by(16) {
        for (t, lt) in l.iter_mut().enumerate() {
            let x = vmulq_f32(vld1q_f32(a.add(c + 4 * t)), vld1q_f32(b.add(c + 4 * t)));
            *lt = vaddq_f32(*lt, x);
        }
    }
    // Lanes i += i + 8, then i += i + 4, i += i + 2, i += i + 1.
    let v = vaddq_f32(vaddq_f32(l[0], l[2]), vaddq_f32(l[1], l[3]));
    let h = vadd_f32(vget_low_f32(v), vget_high_f32(v));
    vget_lane_f32::<0>(h) + vget_lane_f32::<1>(h)
}

/// f16 to f32 (exact either way), eight at a time.
///
/// # Safety
/// Advanced SIMD present.
#[target_feature(enable = "neon")]
pub(in crate::attention) unsafe fn widen(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen lengths");
    let whole = src.len() / 8 * 8;
    for i in (0..whole).step_by(8) {
        let h = vld1q_u16(src.as_ptr().add(i) as *const u16);
        let (lo, hi): (float32x4_t, float32x4_t);
        // The f16 widening's intrinsic is not stable yet.
        asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            h = in(vreg) h,
            lo = out(vreg) lo,
            hi = out(vreg) hi,
            options(pure, nomem, nostack, preserves_flags)
        );
        vst1q_f32(dst.as_mut_ptr().add(i), lo);
        vst1q_f32(dst.as_mut_ptr().add(i + 4), hi);
    }
    src[whole..].convert_to_f32_slice(&mut dst[whole..]);
}
