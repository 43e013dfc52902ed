//! The run-time kernel level and the canonical scalar block dot (the reference every SIMD
//! path matches bit for bit; see mod.rs).

use super::{Format, QuantRow, Unpacked, QK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Portable,
    /// AVX2 and F16C: the GEMM (`gemm.rs`), attention, exp and activations in 8 lanes.
    Avx2,
    /// As `Avx2`, the GEMM's integer dots by AVX-512 VNNI on 256-bit vectors.
    Avx512Vnni,
    /// As `Avx512Vnni`, the GEMM on 512-bit vectors: tiles of two row groups (`gemm_wide.rs`).
    Avx512,
}

impl Level {
    /// Whether the AVX2 (8-lane) paths run: every level but the scalar one.
    pub fn avx2(self) -> bool {
        self != Level::Portable
    }

    /// Whether the GEMM's integer dots are `vpdpbusd` (either width).
    pub fn vnni(self) -> bool {
        matches!(self, Level::Avx512Vnni | Level::Avx512)
    }

    /// Whether the 512-bit paths run.
    pub fn wide(self) -> bool {
        self == Level::Avx512
    }

    /// The path's name in benchmark results.
    pub fn name(self) -> &'static str {
        match self {
            Level::Portable => "portable",
            Level::Avx2 => "avx2",
            Level::Avx512Vnni => "avx512vnni-256",
            Level::Avx512 => "avx512",
        }
    }
}

/// The kernel path this CPU runs, detected once. `EDGEPROMPT_PORTABLE` forces the scalar one,
/// `EDGEPROMPT_AVX2` the AVX2 one on a VNNI machine, `EDGEPROMPT_256` the 256-bit VNNI one on
/// an AVX-512 machine (to compare the paths).
pub static LEVEL: std::sync::LazyLock<Level> = std::sync::LazyLock::new(|| {
    if std::env::var_os("EDGEPROMPT_PORTABLE").is_some() {
        return Level::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        let vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni");
        if !vnni || std::env::var_os("EDGEPROMPT_AVX2").is_some() {
            return Level::Avx2;
        }
        if !is_x86_feature_detected!("avx512bw") || std::env::var_os("EDGEPROMPT_256").is_some() {
            return Level::Avx512Vnni;
        }
        return Level::Avx512;
    }
    Level::Portable
});

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
