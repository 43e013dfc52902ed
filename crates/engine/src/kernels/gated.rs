//! The gated activations of the feed-forward block, `g = act(g) * u` with SiLU or GELU's tanh
//! form: a sigmoid from `exp_neg` only, the same operations on every path (`x86/gated.rs`,
//! `arm/gated.rs` lane-wise; `silu_mul` and `gelu_mul` in mod.rs pick), so the same bits.

use super::exp::exp_neg;

/// `2 sqrt(2 / pi)` and that times 0.044715: GELU's tanh form as a sigmoid,
/// `0.5 (1 + tanh(u)) = sigmoid(2u)`.
pub(crate) const GELU_A: f32 = 1.595_769;
pub(crate) const GELU_B: f32 = 0.071_354_82;

/// The scalar form of `g = act(g) * u`, for what the lanes leave.
pub(crate) fn gated_tail<const GELU: bool>(g: &mut [f32], u: &[f32]) {
    for (x, &y) in g.iter_mut().zip(u) {
        *x = act1::<GELU>(*x) * y;
    }
}

#[inline(always)]
pub(crate) fn act1<const GELU: bool>(x: f32) -> f32 {
    let z = if GELU {
        x * (GELU_A + GELU_B * (x * x))
    } else {
        x
    };
    // sigmoid from e^-|z| only, so the exponential never overflows.
    let e = exp_neg(-z.abs());
    let num = if z >= 0.0 { 1.0 } else { e };
    x * (num / (1.0 + e))
}
