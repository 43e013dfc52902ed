//! `x [m, k] · wᵀ` for weights kept as floats: f32, and f16 or bf16 as the file stores them,
//! each value widened exactly to f32 when a call reads it (the file's values are kept as stored).
//!
//! Every output is `dot`'s: value `i` into lane `i % 16` by a fused multiply-add (one rounding,
//! the same in every path's FMA and in `f32::mul_add`; half the floating-point operations of a
//! multiply then an add, which bound the tiles on AVX2), the tail into the first lanes, the
//! lanes summed by a fixed tree. The tiled paths (`x86/float.rs`, `arm/float.rs`) give those
//! bits, and a row's result never depends on the rows beside it.

use half::{bf16, f16};

use super::{Level, LEVEL};

#[cfg(target_arch = "aarch64")]
pub(crate) use super::arm::float::Load;
#[cfg(target_arch = "x86_64")]
pub(crate) use super::x86::float::Load;

/// A value a float matrix stores.
pub(crate) trait Elem: Copy + Send + Sync + 'static {
    fn get(self) -> f32;
}

impl Elem for f32 {
    fn get(self) -> f32 {
        self
    }
}

impl Elem for f16 {
    fn get(self) -> f32 {
        self.to_f32()
    }
}

impl Elem for bf16 {
    fn get(self) -> f32 {
        self.to_f32()
    }
}

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

/// The tail values into the first lanes, then the lanes summed by a fixed tree.
fn finish<E: Elem>(mut lanes: [f32; 16], x: &[f32], w: &[E]) -> f32 {
    for (i, (a, b)) in x.iter().zip(w).enumerate() {
        lanes[i] = a.mul_add(b.get(), lanes[i]);
    }
    tree(lanes)
}

/// Lane `i` plus lane `i + h` for `h` = 8, 4, 2, 1: the order every path's `Lanes::sum` keeps.
#[inline(always)]
fn tree(mut lanes: [f32; 16]) -> f32 {
    let mut h = 8;
    while h > 0 {
        for i in 0..h {
            lanes[i] += lanes[i + h];
        }
        h /= 2;
    }
    lanes[0]
}

/// Sixteen f32 lanes of a SIMD path: what a tile needs of it.
pub(crate) trait Lanes<E>: Copy {
    unsafe fn zero() -> Self;
    /// Sixteen activations at `p`.
    unsafe fn x(p: *const f32) -> Self;
    /// Sixteen weights at `p`, widened to f32.
    unsafe fn w(p: *const E) -> Self;
    /// `acc + a * b`, fused: rounded once.
    unsafe fn mul_add(acc: Self, a: Self, b: Self) -> Self;
    unsafe fn store(self, out: &mut [f32; 16]);
    /// The lanes summed by `tree`'s order (paths with a shuffle tree override it).
    #[inline(always)]
    unsafe fn sum(self) -> f32 {
        let mut lanes = [0f32; 16];
        self.store(&mut lanes);
        tree(lanes)
    }
}

/// Activation bytes a task's row chunk keeps in cache while its weight rows pass over it.
const CHUNK_BYTES: usize = 192 << 10;

thread_local! {
    /// The calling thread's widened weight rows, reused across calls.
    static WIDE: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `block` by tiles of `R` activation rows and `C` weight rows in `V`'s lanes (the rest by
/// tiles of one column, lone rows by tiles of one row and one column).
///
/// f16 and bf16 rows are widened to f32 once for the whole call when it has row tiles enough
/// to reuse them: every chunk's tiles then load floats, where widening a pair of rows again
/// for each chunk had cost 11 % of the GEMM (Zen 1, qwen05 f16 prefill of 512).
///
/// # Safety
/// `V`'s features present; `w`, `x`, `out` as `block`'s.
#[inline(always)]
pub(crate) unsafe fn tiles<V: Lanes<E> + Lanes<f32>, E: Elem, const R: usize, const C: usize>(
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let halves = std::any::TypeId::of::<E>() != std::any::TypeId::of::<f32>();
    if !halves || m < 2 * R {
        return chunks::<V, E, R, C>(w, cols, k, x, m, out);
    }
    let mut wide = WIDE.take();
    wide.resize(cols * k, 0f32);
    widen_rows::<V, E>(&w[..cols * k], &mut wide);
    chunks::<V, f32, R, C>(&wide, cols, k, x, m, out);
    WIDE.set(wide);
}

/// `tiles` over chunks of activation rows that stay in cache while the weight rows pass.
#[inline(always)]
unsafe fn chunks<V: Lanes<E>, E: Elem, const R: usize, const C: usize>(
    w: &[E],
    cols: usize,
    k: usize,
    x: &[f32],
    m: usize,
    out: &mut [f32],
) {
    let chunk = (CHUNK_BYTES / (4 * k.max(1)) / R * R).max(R);
    for r0 in (0..m).step_by(chunk) {
        let r1 = (r0 + chunk).min(m);
        let mut c = 0;
        while c < cols {
            let cw = if cols - c >= C { C } else { 1 };
            let rows = &w[c * k..];
            let mut r = r0;
            while r < r1 {
                let rw = if r1 - r >= R { R } else { 1 };
                let at = Tile {
                    w: rows,
                    k,
                    x,
                    r,
                    c,
                    cols,
                };
                if rw < R {
                    // A lone row reads its weight rows one at a time: one stream a thread
                    // comes closer to the memory's bandwidth than rows side by side (Zen 4,
                    // qwen05 f16 decode: 31 tok/s against 18 with four).
                    for j in 0..cw {
                        let one = Tile {
                            w: &rows[j * k..],
                            c: c + j,
                            ..at
                        };
                        tile::<V, E, 1, 1>(&one, out);
                    }
                } else if cw == C {
                    tile::<V, E, R, C>(&at, out);
                } else {
                    tile::<V, E, R, 1>(&at, out);
                }
                r += rw;
            }
            c += cw;
        }
    }
}

/// `src` widened into `dst` (as long) by `V`'s loads.
#[inline(always)]
unsafe fn widen_rows<V: Lanes<E>, E: Elem>(src: &[E], dst: &mut [f32]) {
    let full = src.len() / 16 * 16;
    let mut v = [0f32; 16];
    for i in (0..full).step_by(16) {
        V::w(src.as_ptr().add(i)).store(&mut v);
        dst[i..i + 16].copy_from_slice(&v);
    }
    for (d, s) in dst[full..].iter_mut().zip(&src[full..]) {
        *d = s.get();
    }
}

/// Where a tile reads and writes: activation rows from `r`, its weight rows from the start of
/// `w`, output columns from `c`.
#[derive(Clone, Copy)]
struct Tile<'a, E> {
    w: &'a [E],
    k: usize,
    x: &'a [f32],
    r: usize,
    c: usize,
    cols: usize,
}

#[inline(always)]
unsafe fn tile<V: Lanes<E>, E: Elem, const R: usize, const C: usize>(
    t: &Tile<'_, E>,
    out: &mut [f32],
) {
    let k = t.k;
    let full = k / 16 * 16;
    let (wp, xp) = (t.w.as_ptr(), t.x.as_ptr());
    let mut acc = [[V::zero(); C]; R];
    let mut i = 0;
    while i < full {
        let mut wv = [V::zero(); C];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = V::w(wp.add(j * k + i));
        }
        for (a, row) in acc.iter_mut().enumerate() {
            let xv = V::x(xp.add((t.r + a) * k + i));
            for (s, v) in row.iter_mut().zip(&wv) {
                *s = V::mul_add(*s, xv, *v);
            }
        }
        i += 16;
    }
    for (a, row) in acc.iter().enumerate() {
        let xr = &t.x[(t.r + a) * k..(t.r + a + 1) * k];
        for (j, s) in row.iter().enumerate() {
            out[(t.r + a) * t.cols + t.c + j] = if full == k {
                s.sum()
            } else {
                let mut lanes = [0f32; 16];
                s.store(&mut lanes);
                finish(lanes, &xr[full..], &t.w[j * k + full..(j + 1) * k])
            };
        }
    }
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
