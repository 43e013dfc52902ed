//! Activation rows quantized for the GEMM: i8 values with one f32 scale `d` per scale block
//! (32 values for the 32-block formats, 256 for the K formats, whose super blocks are then
//! summed in integers), `d * sum` per scale block (formats with a min), and the exact integer
//! sums of each 32-block and its halves (zero-point and min corrections). The values and
//! scales are those of `quantize_row_by` (the scalar path's), bit for bit; the tiled GEMMs read
//! this form. The per-ISA block quantizers live in `x86/act_quant.rs` and `arm/act_quant.rs`.

use super::QK;

#[derive(Default)]
pub(crate) struct Acts {
    /// 32-blocks per row.
    pub nb: usize,
    /// Scale blocks per row (`nb`, or `nb / 8` for 256-value scale blocks).
    pub ns: usize,
    /// i8 values per row in `q` (`nb * 32`).
    pub row_stride: usize,
    pub q: Vec<i8>,
    /// Per scale block.
    pub d: Vec<f32>,
    pub s: Vec<f32>,
    /// Per 32-block.
    pub bsum: Vec<i32>,
    /// The two half-block sums as the i16 halves of one i32 (low: first half), for `madd`.
    pub hpair: Vec<i32>,
    /// The sums of 32-blocks `2p` and `2p + 1` as the i16 halves of one i32 (q4_K mins).
    pub bpair: Vec<i32>,
}

/// Where rows `i0..i0 + MT` start in each of `Acts`' arrays: what one GEMM tile reads.
pub(crate) struct TileRows<const MT: usize> {
    pub q: [*const i8; MT],
    /// Per scale block: `d` and `s`.
    pub d: [*const f32; MT],
    pub s: [*const f32; MT],
    /// Per 32-block: `bsum` and `hpair`; per pair of them: `bpair`.
    pub bsum: [*const i32; MT],
    pub hpair: [*const i32; MT],
    // The arm tiles sum q4_K's mins per block, not by pairs.
    #[cfg_attr(target_arch = "aarch64", allow(dead_code))]
    pub bpair: [*const i32; MT],
}

impl Acts {
    /// The tile pointers of rows `i0..i0 + MT` (computed only; reading them is the tile's
    /// business, within the rows `fill` made). Inlined so that a kernel computes only the
    /// pointers it reads: as a call it built all six arrays per tile (4 % of a decode step).
    #[inline(always)]
    pub fn rows<const MT: usize>(&self, i0: usize) -> TileRows<MT> {
        let (nb, ns) = (self.nb, self.ns);
        // A loop, not `from_fn`: at sixteen rows `from_fn` stayed a call (4 % of a prefill).
        let mut t = TileRows {
            q: [std::ptr::null(); MT],
            d: [std::ptr::null(); MT],
            s: [std::ptr::null(); MT],
            bsum: [std::ptr::null(); MT],
            hpair: [std::ptr::null(); MT],
            bpair: [std::ptr::null(); MT],
        };
        for i in 0..MT {
            let r = i0 + i;
            t.q[i] = self.q.as_ptr().wrapping_add(r * self.row_stride);
            t.d[i] = self.d.as_ptr().wrapping_add(r * ns);
            t.s[i] = self.s.as_ptr().wrapping_add(r * ns);
            t.bsum[i] = self.bsum.as_ptr().wrapping_add(r * nb);
            t.hpair[i] = self.hpair.as_ptr().wrapping_add(r * nb);
            t.bpair[i] = self.bpair.as_ptr().wrapping_add(r * nb / 2);
        }
        t
    }

    /// Quantizes `x` (`[m, k]`) with one scale per `width` values (32 or 256), reusing this
    /// value's buffers. Many rows are cut over the pool: each row is quantized by itself, so
    /// the cut changes no value (a batch-32 decode step spent ~5 % of its time here on the
    /// calling thread while the others waited).
    pub(super) fn fill(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        width: usize,
        quantize: Quantizer,
    ) {
        let nb = k / QK;
        self.nb = nb;
        self.ns = k / width;
        self.row_stride = nb * QK;
        self.q.resize(m * nb * QK, 0);
        self.d.resize(m * self.ns, 0.0);
        self.s.resize(m * self.ns, 0.0);
        self.bsum.resize(m * nb, 0);
        self.hpair.resize(m * nb, 0);
        self.bpair.resize(m * nb.div_ceil(2), 0);
        assert!(
            k >= width && k.is_multiple_of(width),
            "rows of whole scale blocks"
        );
        let x = &x[..m * k];
        let threads = rayon::current_num_threads();
        let tasks = if m * k >= PAR_MIN_VALUES {
            threads.min(m)
        } else {
            1
        };
        let per = m.div_ceil(tasks.max(1)).max(1);
        let ns = self.ns;
        let mut parts: Vec<RowsMut> = x
            .chunks((per * k).max(1))
            .zip(self.q.chunks_mut(per * nb * QK))
            .zip(self.d.chunks_mut(per * ns))
            .zip(self.s.chunks_mut(per * ns))
            .zip(self.bsum.chunks_mut(per * nb))
            .zip(self.hpair.chunks_mut(per * nb))
            .zip(self.bpair.chunks_mut((per * nb / 2).max(1)))
            .map(|((((((x, q), d), s), bsum), hpair), bpair)| RowsMut {
                x,
                q,
                d,
                s,
                bsum,
                hpair,
                bpair,
            })
            .collect();
        crate::par::each(&mut parts, 2, &|_, p| quantize(p, width));
    }
}

/// Below this many values `fill` stays on the calling thread (a pool call costs about a
/// microsecond, quantizing a 576-wide row about half of one).
const PAR_MIN_VALUES: usize = 8 * 1024;

/// Whole rows of `Acts`' arrays and their input: what one task of `fill` writes.
pub(super) struct RowsMut<'a> {
    x: &'a [f32],
    q: &'a mut [i8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    bsum: &'a mut [i32],
    hpair: &'a mut [i32],
    bpair: &'a mut [i32],
}

/// A path's quantizer of `fill`'s rows (`x86/act_quant.rs`, `arm/act_quant.rs`,
/// `quantize_scalar`), picked by the caller: every one gives `quantize_row_by`'s bits.
pub(super) type Quantizer = fn(&mut RowsMut, usize);

/// The portable path's quantizer.
pub(super) fn quantize_scalar(rows: &mut RowsMut, width: usize) {
    // SAFETY: the scalar quantizer needs no feature; every slice is whole 32-blocks.
    unsafe { rows.quantize_by::<Scalar>(width) }
}

impl RowsMut<'_> {
    /// The rows' blocks by `B`'s block quantizer, inlined into the caller's features: as
    /// calls per 32-block the kernels cost about as much as their work.
    #[inline(always)]
    pub(super) unsafe fn quantize_by<B: BlockQuant>(&mut self, width: usize) {
        let per = width / QK;
        for sb in 0..self.d.len() {
            let xs = &self.x[sb * width..(sb + 1) * width];
            let amax = xs.chunks_exact(QK).map(|b| B::amax(b)).fold(0f32, f32::max);
            let d = amax / 127.0;
            // A subnormal scale's inverse is infinite: such a block quantizes to zeros on every path.
            let id = if d > 0.0 && (1.0 / d).is_finite() {
                1.0 / d
            } else {
                0.0
            };
            let mut sum = 0;
            for (j, b) in xs.chunks_exact(QK).enumerate() {
                let at = sb * per + j;
                let q = &mut self.q[at * QK..(at + 1) * QK];
                let (h0, h1) = B::quantize(b, id, q);
                self.bsum[at] = h0 + h1;
                // |h| <= 16 * 127: both fit in i16.
                self.hpair[at] = (h0 & 0xFFFF) | (h1 << 16);
                sum += h0 + h1;
            }
            self.d[sb] = d;
            self.s[sb] = d * sum as f32;
        }
        if per > 1 {
            // |bsum| <= 32 * 127 fits in i16.
            for (p, pair) in self.bpair.iter_mut().enumerate() {
                *pair = (self.bsum[2 * p] & 0xFFFF) | (self.bsum[2 * p + 1] << 16);
            }
        }
    }
}

/// One 32-block's quantizer on some instruction set: each gives `quantize_row_by`'s bits.
pub(super) trait BlockQuant {
    /// Largest |x| of the block (max is exact, so any order gives its bits).
    unsafe fn amax(xs: &[f32]) -> f32;
    /// `round(x * id)` (half away from zero) into `q`; the sums of the block's two halves.
    unsafe fn quantize(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32);
}

/// The scalar block quantizer (the portable path).
pub(super) struct Scalar;

impl BlockQuant for Scalar {
    unsafe fn amax(xs: &[f32]) -> f32 {
        xs[..QK].iter().fold(0f32, |a, v| a.max(v.abs()))
    }

    unsafe fn quantize(xs: &[f32], id: f32, q: &mut [i8]) -> (i32, i32) {
        let mut h = [0i32; 2];
        for (i, (q, v)) in q[..QK].iter_mut().zip(&xs[..QK]).enumerate() {
            *q = (v * id).round() as i8;
            h[i / 16] += *q as i32;
        }
        (h[0], h[1])
    }
}
