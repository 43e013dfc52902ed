//! `exp` for the non-positive arguments of online softmax, the same bits on every path: plain
//! f32 multiplies and adds in a fixed order (no FMA), so the scalar function and the 8-lane
//! AVX2 one agree exactly, and attention stays bit-identical across kernels. Cody-Waite range
//! reduction and Cephes' degree-6 polynomial: about 1 ulp from the true value.

pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^15.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
pub(crate) const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// Below this the result underflows: 0.
pub(crate) const MIN_ARG: f32 = -87.0;

/// `e^x` for `x <= 0` (larger arguments are not attention's and are not handled).
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    if x.is_nan() || x < MIN_ARG {
        return 0.0;
    }
    let n = (x * LOG2E + 0.5).floor();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = P[0];
    for c in &P[1..] {
        p = p * r + c;
    }
    let y = (p * (r * r) + r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_libm_over_the_range() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let (got, want) = (exp_neg(x) as f64, (x as f64).exp());
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(-100.0), 0.0);
    }
}
