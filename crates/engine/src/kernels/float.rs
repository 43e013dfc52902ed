//! `x [m, k] · wᵀ` for weights kept as floats: f32, and f16 or bf16 as the file stores them,
//! each value widened exactly to f32 when a call reads it (the file's values are kept as stored).
//!
//! Every output is `dot`'s: value `i` into lane `i % 16` by a fused multiply-add (one rounding,
//! the same in every path's FMA and in `f32::mul_add`; half the floating-point operations of a
//! multiply then an add, which bound the tiles on AVX2), the tail into the first lanes, the
//! lanes summed by a fixed tree. The tiled paths (`x86/float.rs`, `arm/float.rs`) give those
//! bits, and a row's result never depends on the rows beside it.

use half::{bf16, f16};

use super::float_tile::{finish, Elem};
use super::{Level, LEVEL};

#[cfg(target_arch = "aarch64")]
pub(crate) use super::arm::float::Load;
#[cfg(target_arch = "x86_64")]
pub(crate) use super::x86::float::Load;

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(crate) trait Load: Elem {}
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl<T: Elem> Load for T {}

/// The values of a float matrix, row-major.
pub enum Floats {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
}

impl Floats {
    fn len(&self) -> usize {
        match self {
            Floats::F32(w) => w.len(),
            Floats::F16(w) => w.len(),
            Floats::BF16(w) => w.len(),
        }
    }
}

/// One weight matrix `[n, k]` of floats.
pub struct FloatMatrix {
    w: Floats,
    n: usize,
    k: usize,
}

/// Output columns (weight rows) a task takes.
const TASK_COLS: usize = 32;

impl FloatMatrix {
    /// `None` unless `w` holds `n * k` values.
    pub fn new(w: Floats, n: usize, k: usize) -> Option<Self> {
        (w.len() == n.checked_mul(k)?).then_some(Self { w, n, k })
    }

    pub fn out_dim(&self) -> usize {
        self.n
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// Bytes held, as the file stores them.
    pub fn bytes(&self) -> usize {
        match &self.w {
            Floats::F32(w) => w.len() * 4,
            Floats::F16(w) => w.len() * 2,
            Floats::BF16(w) => w.len() * 2,
        }
    }

    /// Row `i` widened to f32 (an embedding lookup).
    pub fn row(&self, i: usize, out: &mut [f32]) {
        fn widen<E: Elem>(w: &[E], out: &mut [f32]) {
            for (o, v) in out.iter_mut().zip(w) {
                *o = v.get();
            }
        }
        let r = i * self.k..(i + 1) * self.k;
        match &self.w {
            Floats::F32(w) => widen(&w[r], out),
            Floats::F16(w) => widen(&w[r], out),
            Floats::BF16(w) => widen(&w[r], out),
        }
    }

    /// `x [m, k] · wᵀ`, `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        self.matmul_at(*LEVEL, x, m)
    }

    /// `matmul` on the kernel path `level` (at most the detected one).
    fn matmul_at(&self, level: Level, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "matmul input shape");
        match &self.w {
            Floats::F32(w) => gemm(level, w, self.n, self.k, x, m),
            Floats::F16(w) => gemm(level, w, self.n, self.k, x, m),
            Floats::BF16(w) => gemm(level, w, self.n, self.k, x, m),
        }
    }
}

/// The columns in tasks of `TASK_COLS` over the pool, each task's `[m, cols]` block then
/// copied into place.
fn gemm<E: Load>(level: Level, w: &[E], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let mut parts: Vec<(usize, Vec<f32>)> = (0..n.div_ceil(TASK_COLS))
        .map(|c| (c * TASK_COLS, Vec::new()))
        .collect();
    crate::par::each(&mut parts, 2, &|_, (c0, part)| {
        let cols = TASK_COLS.min(n - *c0);
        *part = vec![0f32; m * cols];
        block(level, &w[*c0 * k..(*c0 + cols) * k], cols, k, x, m, part);
    });
    let mut out = vec![0f32; m * n];
    for (c0, part) in &parts {
        let cols = TASK_COLS.min(n - c0);
        for (r, p) in part.chunks_exact(cols).enumerate() {
            out[r * n + c0..r * n + c0 + cols].copy_from_slice(p);
        }
    }
    out
}

/// `out [m, cols]` for the weight rows `w [cols, k]`, on `level`'s path.
fn block<E: Load>(
    level: Level,
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    // SAFETY: each path only where `level` (at most the detected one) says its features are
    // present; `w`, `x` and `out` hold `cols * k`, `m * k` and `m * cols` values.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        if level.wide() {
            return super::x86::float::block512(w, cols, k, x, m, out);
        }
        if level.avx2() {
            return super::x86::float::block256(w, cols, k, x, m, out);
        }
    }
    #[cfg(target_arch = "aarch64")]
    unsafe {
        if level.neon() {
            return super::arm::float::block(w, cols, k, x, m, out);
        }
    }
    let _ = level;
    for (xr, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(cols)) {
        for (c, y) in o.iter_mut().enumerate() {
            *y = dot(xr, &w[c * k..(c + 1) * k]);
        }
    }
}

/// The reference every path gives: `x · w` in `x.len() / 16` steps of sixteen lanes, then the
/// tail and the tree (`finish`).
pub(crate) fn dot<E: Elem>(x: &[f32], w: &[E]) -> f32 {
    let full = x.len() / 16 * 16;
    let mut lanes = [0f32; 16];
    for (xs, ws) in x[..full].chunks_exact(16).zip(w[..full].chunks_exact(16)) {
        for i in 0..16 {
            lanes[i] = xs[i].mul_add(ws[i].get(), lanes[i]);
        }
    }
    finish(lanes, &x[full..], &w[full..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn levels() -> Vec<Level> {
        let mut v = LEVEL.below();
        v.extend([*LEVEL, Level::Portable]);
        v
    }

    /// Random finite values of each kind: f16 over every finite bit pattern (subnormals
    /// included), bf16 and f32 of moderate size.
    fn random(kind: usize, len: usize, seed: &mut u64) -> Floats {
        match kind {
            0 => Floats::F32(
                (0..len)
                    .map(|_| (lcg(seed) % 20001) as f32 * 1e-4 - 1.0)
                    .collect(),
            ),
            1 => Floats::F16(
                (0..len)
                    .map(|_| loop {
                        let h = f16::from_bits(lcg(seed) as u16);
                        if h.is_finite() {
                            break h;
                        }
                    })
                    .collect(),
            ),
            _ => Floats::BF16(
                (0..len)
                    .map(|_| {
                        let b = lcg(seed) as u16;
                        // Exponents 2^-27 .. 2^4: no overflow in a dot.
                        bf16::from_bits((b & 0x807f) | ((100 + (b >> 7) % 32) << 7))
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn every_path_gives_the_reference_dot_in_any_batch() {
        let mut seed = 7;
        // Lone rows, whole tiles, and chunks of eight or more rows (weight rows widened once).
        for (m, n, k) in [
            (1, 1, 16),
            (1, 37, 100),
            (5, 9, 64),
            (7, 70, 200),
            (3, 33, 15),
            (9, 21, 48),
            (17, 12, 100),
        ] {
            let x: Vec<f32> = (0..m * k)
                .map(|_| (lcg(&mut seed) % 2001) as f32 * 1e-3 - 1.0)
                .collect();
            for kind in 0..3 {
                let w = FloatMatrix::new(random(kind, n * k, &mut seed), n, k).unwrap();
                let mut wr = vec![0f32; k];
                let want: Vec<u32> = x
                    .chunks_exact(k)
                    .flat_map(|xr| {
                        (0..n)
                            .map(|c| {
                                w.row(c, &mut wr);
                                dot(xr, &wr).to_bits()
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                for level in levels() {
                    let got: Vec<u32> = w
                        .matmul_at(level, &x, m)
                        .iter()
                        .map(|v| v.to_bits())
                        .collect();
                    assert_eq!(got, want, "{level:?} kind {kind} ({m}, {n}, {k})");
                    for (r, xr) in x.chunks_exact(k).enumerate() {
                        let one: Vec<u32> = w
                            .matmul_at(level, xr, 1)
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        assert_eq!(one, want[r * n..(r + 1) * n], "{level:?} row {r} alone");
                    }
                }
            }
        }
    }

    #[test]
    fn every_path_widens_every_finite_half_exactly() {
        // Each finite f16 and bf16 pattern as a weight, read by a one-hot activation row: the
        // output is the widened value itself.
        let k = 16;
        for kind in 1..3 {
            let vals: Vec<u16> = (0..=u16::MAX)
                .filter(|&b| match kind {
                    1 => f16::from_bits(b).is_finite(),
                    _ => bf16::from_bits(b).is_finite(),
                })
                .collect();
            let n = vals.len().div_ceil(k);
            let mut bits: Vec<u16> = vals.clone();
            bits.resize(n * k, 0);
            let w = match kind {
                1 => Floats::F16(bits.iter().map(|&b| f16::from_bits(b)).collect()),
                _ => Floats::BF16(bits.iter().map(|&b| bf16::from_bits(b)).collect()),
            };
            let w = FloatMatrix::new(w, n, k).unwrap();
            let mut x = vec![0f32; k * k];
            for i in 0..k {
                x[i * k + i] = 1.0;
            }
            for level in levels() {
                let out = w.matmul_at(level, &x, k);
                for (j, &b) in bits.iter().enumerate() {
                    let want = match kind {
                        1 => f16::from_bits(b).to_f32(),
                        _ => bf16::from_bits(b).to_f32(),
                    };
                    // out[lane, row]: a zero's sign may go in the other lanes' zeros.
                    assert!(
                        out[(j % k) * n + j / k] == want,
                        "{level:?} kind {kind} bits {b:#06x}"
                    );
                }
            }
        }
    }
}
