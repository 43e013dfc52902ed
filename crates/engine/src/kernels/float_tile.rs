//! What every float GEMM path shares (`x86/float.rs`, `arm/float.rs`): the stored value
//! types, a SIMD path's sixteen lanes, and the tiles over them, which give `float::dot`'s bits.

use half::{bf16, f16};

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

/// The tail values into the first lanes, then the lanes summed by a fixed tree.
pub(crate) fn finish<E: Elem>(mut lanes: [f32; 16], x: &[f32], w: &[E]) -> f32 {
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
