//! Quantized matrix multiply for the GGUF block formats candle runs with scalar code
//! (q4_0, q4_1, q5_0, q8_0).
//!
//! Activations are quantized per row to 8-bit blocks of 32 with an f32 scale. For each block
//! pair the integer dot product is exact; blocks are then accumulated as floats in one
//! canonical order (block `b` into lane `b % 8`, lanes reduced by a fixed tree). The SIMD and
//! scalar paths produce the same bits, and a row's result never depends on how many rows
//! share the call: prefill, chunked prefill and batched decode agree exactly.

mod formats;
mod simd;

use rayon::prelude::*;

pub use formats::Format;
pub use simd::{Level, LEVEL};

pub const QK: usize = 32;

/// One weight matrix `[n, k]` in a supported GGUF block format.
pub struct QMatrix {
    format: Format,
    n: usize,
    k: usize,
    data: Vec<u8>,
}

/// A weight row unpacked to one i8 per value plus per-block float scale and min, and for
/// q6_K an integer scale per half block (folded into the exact integer dot).
#[derive(Clone)]
struct Unpacked {
    /// Real blocks (the vectors below are padded).
    nb: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    m: Vec<f32>,
    sc: Vec<i32>,
    /// 128 * (scaled) sum of each block's values: undoes the +128 offset of `QuantRow::u`
    /// (AVX-512 VNNI path only).
    corr: Vec<i32>,
}

/// Rows are padded with zero blocks to a multiple of `PAD_BLOCKS`, so SIMD groups of 8 (or 16)
/// blocks never read past the end; padded blocks contribute exactly nothing.
pub(crate) const PAD_BLOCKS: usize = 16;

fn padded_blocks(nb: usize) -> usize {
    nb.div_ceil(PAD_BLOCKS) * PAD_BLOCKS
}

impl Unpacked {
    fn new(k: usize) -> Self {
        let nb = k / QK;
        let pb = padded_blocks(nb);
        Self {
            nb,
            q: vec![0; pb * QK],
            d: vec![0.0; pb],
            m: vec![0.0; pb],
            sc: vec![1; 2 * pb],
            corr: vec![0; pb],
        }
    }
}

/// A row of activations quantized to blocks of 32 i8 values.
pub(crate) struct QuantRow {
    pub q: Vec<i8>,
    /// `q + 128` as unsigned bytes, for `vpdpbusd` (unsigned x signed, no saturation).
    pub u: Vec<u8>,
    pub d: Vec<f32>,
    /// d * sum(q) per block: the block's sum, for formats with a min.
    pub s: Vec<f32>,
}

impl QMatrix {
    pub fn new(format: Format, n: usize, k: usize, data: Vec<u8>) -> Option<Self> {
        let bv = format.block_values();
        let expect = n * (k / bv) * format.block_bytes();
        (k.is_multiple_of(bv) && data.len() == expect).then_some(Self { format, n, k, data })
    }

    pub fn out_dim(&self) -> usize {
        self.n
    }

    pub fn in_dim(&self) -> usize {
        self.k
    }

    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        let rb = self.row_bytes();
        self.format
            .dequantize(&self.data[row * rb..(row + 1) * rb], self.k)
    }

    fn row_bytes(&self) -> usize {
        (self.k / self.format.block_values()) * self.format.block_bytes()
    }

    /// `x`: `[m, k]` row-major f32 -> `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        assert_eq!(x.len(), m * self.k, "matmul input shape");
        let acts: Vec<QuantRow> = x.chunks_exact(self.k).map(quantize_row).collect();
        let mut out_t = vec![0f32; self.n * m];
        // Column-major output so each task owns a contiguous slice of whole weight rows.
        const ROWS_PER_TASK: usize = 16;
        out_t
            .par_chunks_mut(ROWS_PER_TASK * m)
            .enumerate()
            .for_each(|(task, dst)| {
                let mut un = Unpacked::new(self.k);
                let rb = self.row_bytes();
                for (i, col) in dst.chunks_exact_mut(m).enumerate() {
                    let row = task * ROWS_PER_TASK + i;
                    simd::row_dots(
                        self.format,
                        &self.data[row * rb..(row + 1) * rb],
                        &mut un,
                        &acts,
                        col,
                    );
                }
            });
        // Back to row-major [m, n].
        let mut out = vec![0f32; m * self.n];
        for (j, col) in out_t.chunks_exact(m).enumerate() {
            for (i, v) in col.iter().enumerate() {
                out[i * self.n + j] = *v;
            }
        }
        out
    }
}

pub(crate) fn quantize_row(x: &[f32]) -> QuantRow {
    let pb = padded_blocks(x.len() / QK);
    let mut r = QuantRow {
        q: vec![0; pb * QK],
        u: Vec::new(),
        d: vec![0.0; pb],
        s: vec![0.0; pb],
    };
    for (b, (xs, qs)) in x.chunks_exact(QK).zip(r.q.chunks_exact_mut(QK)).enumerate() {
        let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, v) in qs.iter_mut().zip(xs) {
            *q = (v * id).round() as i8;
            sum += *q as i32;
        }
        r.d[b] = d;
        r.s[b] = d * sum as f32;
    }
    r.u = r.q.iter().map(|&q| (q as i16 + 128) as u8).collect();
    r
}

#[cfg(test)]
mod tests;
