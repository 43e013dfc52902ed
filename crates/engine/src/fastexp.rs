//! `exp` for the non-positive arguments of online softmax, the same bits on every path: plain
//! f32 multiplies and adds in a fixed order (no FMA), so the scalar function and the 8-lane
//! AVX2 one agree exactly, and attention stays bit-identical across kernels. Cody-Waite range
//! reduction and Cephes' degree-6 polynomial: about 1 ulp from the true value.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split so that `n * LN2_HI` is exact for |n| < 2^15.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// Below this the result underflows: 0.
const MIN_ARG: f32 = -87.0;

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

/// `exp_neg` of 8 lanes.
///
/// # Safety
/// AVX2 present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn exp_neg8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let ok = _mm256_cmp_ps(x, _mm256_set1_ps(MIN_ARG), _CMP_GE_OQ);
    let x = _mm256_max_ps(x, _mm256_set1_ps(MIN_ARG));
    let n = _mm256_floor_ps(_mm256_add_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _mm256_set1_ps(0.5),
    ));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))),
        _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)),
    );
    let mut p = _mm256_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), ok)
}

/// `exp_neg` of 16 lanes: `exp_neg8`'s operations on 512-bit vectors (floor by rounding
/// down, the out-of-range lanes zeroed by mask), so the same bits.
///
/// # Safety
/// AVX-512 F present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn exp_neg16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let ok = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(MIN_ARG));
    let x = _mm512_max_ps(x, _mm512_set1_ps(MIN_ARG));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(_mm512_add_ps(
        _mm512_mul_ps(x, _mm512_set1_ps(LOG2E)),
        _mm512_set1_ps(0.5),
    ));
    let r = _mm512_sub_ps(
        _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI))),
        _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)),
    );
    let mut p = _mm512_set1_ps(P[0]);
    for c in &P[1..] {
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(*c));
    }
    let y = _mm512_add_ps(
        _mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r),
        _mm512_set1_ps(1.0),
    );
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvttps_epi32(n),
        _mm512_set1_epi32(127),
    ));
    _mm512_maskz_mov_ps(ok, _mm512_mul_ps(y, _mm512_castsi512_ps(e)))
}

/// `exp_neg` of 4 lanes: `exp_neg8`'s operations on Advanced SIMD (floor by `frintm`, the
/// out-of-range lanes cleared by mask), so the same bits.
///
/// # Safety
/// Advanced SIMD present (every aarch64 Linux target).
#[cfg(target_arch = "aarch64")]
#[inline(always)]
pub unsafe fn exp_neg4(x: std::arch::aarch64::float32x4_t) -> std::arch::aarch64::float32x4_t {
    use std::arch::aarch64::*;
    let ok = vcgeq_f32(x, vdupq_n_f32(MIN_ARG));
    let x = vmaxq_f32(x, vdupq_n_f32(MIN_ARG));
    let n = vrndmq_f32(vaddq_f32(
        vmulq_f32(x, vdupq_n_f32(LOG2E)),
        vdupq_n_f32(0.5),
    ));
    let r = vsubq_f32(
        vsubq_f32(x, vmulq_f32(n, vdupq_n_f32(LN2_HI))),
        vmulq_f32(n, vdupq_n_f32(LN2_LO)),
    );
    let mut p = vdupq_n_f32(P[0]);
    for c in &P[1..] {
        p = vaddq_f32(vmulq_f32(p, r), vdupq_n_f32(*c));
    }
    let y = vaddq_f32(
        vaddq_f32(vmulq_f32(p, vmulq_f32(r, r)), r),
        vdupq_n_f32(1.0),
    );
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    let v = vmulq_f32(y, vreinterpretq_f32_s32(e));
    vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), ok))
}

/// `g = silu(g) * u` in place (the gated FFN), with `exp_neg`: the same bits on every path.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    gated_mul::<false>(g, u)
}

/// `g = gelu_tanh(g) * u` in place (Gemma's gated FFN): the same bits on every path.
pub fn gelu_mul(g: &mut [f32], u: &[f32]) {
    gated_mul::<true>(g, u)
}

/// `2 sqrt(2 / pi)` and that times 0.044715: GELU's tanh form as a sigmoid,
/// `0.5 (1 + tanh(u)) = sigmoid(2u)`.
const GELU_A: f32 = 1.595_769;
const GELU_B: f32 = 0.071_354_82;

/// `g = x * sigmoid(z) * u` with `z = x` (SiLU) or GELU's `z = x (A + B x^2)`.
fn gated_mul<const GELU: bool>(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "gated activation lengths");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::LEVEL.wide() {
        // SAFETY: AVX-512 F and AVX2 detected; whole 16- then 8-lane chunks only.
        done = unsafe { gated_mul_avx512::<GELU>(g, u) };
        done += unsafe { gated_mul_avx2::<GELU>(&mut g[done..], &u[done..]) };
    } else if crate::kernels::LEVEL.avx2() {
        // SAFETY: AVX2 detected; whole 8-lane chunks only.
        done = unsafe { gated_mul_avx2::<GELU>(g, u) };
    }
    #[cfg(target_arch = "aarch64")]
    if crate::kernels::LEVEL.neon() {
        // SAFETY: Advanced SIMD is part of every aarch64 target; whole 4-lane chunks only.
        done = unsafe { gated_mul_neon::<GELU>(g, u) };
    }
    for (x, &y) in g[done..].iter_mut().zip(&u[done..]) {
        *x = act1::<GELU>(*x) * y;
    }
}

#[inline(always)]
fn act1<const GELU: bool>(x: f32) -> f32 {
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gated_mul_avx2<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 8 * 8;
    let sign = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let (a, b) = (_mm256_set1_ps(GELU_A), _mm256_set1_ps(GELU_B));
    for i in (0..n).step_by(8) {
        let x = _mm256_loadu_ps(g.as_ptr().add(i));
        let z = if GELU {
            _mm256_mul_ps(x, _mm256_add_ps(a, _mm256_mul_ps(b, _mm256_mul_ps(x, x))))
        } else {
            x
        };
        let e = exp_neg8(_mm256_or_ps(z, sign));
        let neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
        let num = _mm256_blendv_ps(one, e, neg);
        let s = _mm256_div_ps(num, _mm256_add_ps(one, e));
        let y = _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u.as_ptr().add(i)));
        _mm256_storeu_ps(g.as_mut_ptr().add(i), y);
    }
    n
}

/// `gated_mul_avx2`'s operations on 4 lanes of Advanced SIMD: the same bits.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn gated_mul_neon<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::aarch64::*;
    let n = g.len() / 4 * 4;
    let one = vdupq_n_f32(1.0);
    let (a, b) = (vdupq_n_f32(GELU_A), vdupq_n_f32(GELU_B));
    for i in (0..n).step_by(4) {
        let x = vld1q_f32(g.as_ptr().add(i));
        let z = if GELU {
            vmulq_f32(x, vaddq_f32(a, vmulq_f32(b, vmulq_f32(x, x))))
        } else {
            x
        };
        // -|z|: the sign bit set.
        let e = exp_neg4(vnegq_f32(vabsq_f32(z)));
        let neg = vcltq_f32(z, vdupq_n_f32(0.0));
        let num = vbslq_f32(neg, e, one);
        let s = vdivq_f32(num, vaddq_f32(one, e));
        let y = vmulq_f32(vmulq_f32(x, s), vld1q_f32(u.as_ptr().add(i)));
        vst1q_f32(g.as_mut_ptr().add(i), y);
    }
    n
}

/// `gated_mul_avx2`'s operations on 16 lanes (floor by rounding down, the blend by mask):
/// the same bits, half the instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn gated_mul_avx512<const GELU: bool>(g: &mut [f32], u: &[f32]) -> usize {
    use std::arch::x86_64::*;
    let n = g.len() / 16 * 16;
    let sign = _mm512_castsi512_ps(_mm512_set1_epi32(i32::MIN));
    let one = _mm512_set1_ps(1.0);
    let (a, b) = (_mm512_set1_ps(GELU_A), _mm512_set1_ps(GELU_B));
    for i in (0..n).step_by(16) {
        let x = _mm512_loadu_ps(g.as_ptr().add(i));
        let z = if GELU {
            _mm512_mul_ps(x, _mm512_add_ps(a, _mm512_mul_ps(b, _mm512_mul_ps(x, x))))
        } else {
            x
        };
        let e = exp_neg16(_mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(z),
            _mm512_castps_si512(sign),
        )));
        let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(z, _mm512_setzero_ps());
        let num = _mm512_mask_blend_ps(neg, one, e);
        let s = _mm512_div_ps(num, _mm512_add_ps(one, e));
        let y = _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_loadu_ps(u.as_ptr().add(i)));
        _mm512_storeu_ps(g.as_mut_ptr().add(i), y);
    }
    n
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

    #[test]
    fn silu_matches_its_definition_and_every_path_agrees() {
        let g: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) / 25.0).collect();
        let u: Vec<f32> = (0..1001).map(|i| 1.0 + (i % 7) as f32 / 10.0).collect();
        let mut fast = g.clone();
        silu_mul(&mut fast, &u);
        for ((x, y), f) in g.iter().zip(&u).zip(&fast) {
            let want = (*x as f64 / (1.0 + (-*x as f64).exp())) * *y as f64;
            assert!(
                (*f as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{x}: {f} vs {want}"
            );
            assert_eq!(
                f.to_bits(),
                (act1::<false>(*x) * y).to_bits(),
                "{x}: path differs"
            );
        }
    }

    #[test]
    fn gelu_matches_the_tanh_form_and_every_path_agrees() {
        let g: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) / 50.0).collect();
        let u: Vec<f32> = (0..1003).map(|i| 1.0 + (i % 5) as f32 / 10.0).collect();
        let mut fast = g.clone();
        gelu_mul(&mut fast, &u);
        for ((x, y), f) in g.iter().zip(&u).zip(&fast) {
            let xd = *x as f64;
            let t = ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh();
            let want = 0.5 * xd * (1.0 + t) * *y as f64;
            assert!(
                (*f as f64 - want).abs() <= 2e-6 * want.abs().max(1.0),
                "{x}: {f} vs {want}"
            );
            assert_eq!(
                f.to_bits(),
                (act1::<true>(*x) * y).to_bits(),
                "{x}: path differs"
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gated_16_and_8_lane_paths_match_the_scalar_bits() {
        if !crate::kernels::LEVEL.wide() {
            return;
        }
        let mut seed = 11u64;
        let g: Vec<f32> = (0..4096)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
            })
            .collect();
        let u: Vec<f32> = g.iter().map(|x| 1.5 - x / 30.0).collect();
        for gelu in [false, true] {
            let (mut wide, mut narrow) = (g.clone(), g.clone());
            // SAFETY: AVX-512 F (and so AVX2) detected; 4096 is whole 16-lane chunks.
            unsafe {
                if gelu {
                    gated_mul_avx512::<true>(&mut wide, &u);
                    gated_mul_avx2::<true>(&mut narrow, &u);
                } else {
                    gated_mul_avx512::<false>(&mut wide, &u);
                    gated_mul_avx2::<false>(&mut narrow, &u);
                }
            }
            for (i, (w, n)) in wide.iter().zip(&narrow).enumerate() {
                let x = g[i];
                let want = if gelu {
                    act1::<true>(x)
                } else {
                    act1::<false>(x)
                } * u[i];
                assert_eq!(w.to_bits(), want.to_bits(), "16 lanes, {x}");
                assert_eq!(n.to_bits(), want.to_bits(), "8 lanes, {x}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_lanes_match_the_scalar_bits() {
        if !is_x86_feature_detected!("avx2") {
            return;
        }
        use std::arch::x86_64::*;
        let mut seed = 7u64;
        for _ in 0..20_000 {
            let xs: [f32; 8] = std::array::from_fn(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
            });
            let mut out = [0f32; 8];
            // SAFETY: AVX2 detected above.
            unsafe {
                let v = exp_neg8(_mm256_loadu_ps(xs.as_ptr()));
                _mm256_storeu_ps(out.as_mut_ptr(), v);
            }
            for (x, o) in xs.iter().zip(out) {
                assert_eq!(o.to_bits(), exp_neg(*x).to_bits(), "exp({x})");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_lanes_match_the_scalar_bits() {
        if !crate::kernels::LEVEL.wide() {
            return;
        }
        use std::arch::x86_64::*;
        let special = [
            0.0,
            -0.0,
            -87.0,
            -86.99,
            -100.0,
            f32::NEG_INFINITY,
            f32::NAN,
            -1e-30,
        ];
        let mut seed = 9u64;
        for round in 0..20_000 {
            let mut xs: [f32; 16] = std::array::from_fn(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
            });
            if round == 0 {
                xs[..special.len()].copy_from_slice(&special);
            }
            let mut out = [0f32; 16];
            // SAFETY: AVX-512 F detected above (part of the wide level).
            unsafe {
                let v = exp_neg16(_mm512_loadu_ps(xs.as_ptr()));
                _mm512_storeu_ps(out.as_mut_ptr(), v);
            }
            for (x, o) in xs.iter().zip(out) {
                assert_eq!(o.to_bits(), exp_neg(*x).to_bits(), "exp({x})");
            }
        }
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_lanes_match_the_scalar_bits() {
        use std::arch::aarch64::*;
        let special = [
            0.0,
            -0.0,
            -87.0,
            -86.99,
            -100.0,
            f32::NEG_INFINITY,
            f32::NAN,
            -1e-30,
        ];
        let mut seed = 5u64;
        for round in 0..20_000 {
            let mut xs: [f32; 8] = std::array::from_fn(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
            });
            if round == 0 {
                xs.copy_from_slice(&special);
            }
            let mut out = [0f32; 8];
            // SAFETY: Advanced SIMD is part of every aarch64 target.
            unsafe {
                for h in 0..2 {
                    let v = exp_neg4(vld1q_f32(xs.as_ptr().add(4 * h)));
                    vst1q_f32(out.as_mut_ptr().add(4 * h), v);
                }
            }
            for (x, o) in xs.iter().zip(out) {
                assert_eq!(o.to_bits(), exp_neg(*x).to_bits(), "exp({x})");
            }
        }
    }
}
