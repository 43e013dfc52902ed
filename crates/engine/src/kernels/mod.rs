//! Quantized matrix multiply for the GGUF block formats (q4_0, q4_1, q5_0, q8_0, q4_K, q6_K).
//!
//! Activations are quantized per row to 8-bit blocks of 32 with an f32 scale. For each block
//! pair the integer dot product is exact; blocks are then accumulated as floats in one
//! canonical order (block `b` into lane `b % 8`, lanes reduced by a fixed tree). The GEMM
//! (`gemm.rs`: AVX2 or AVX-512 VNNI, on weights repacked at load by `repack.rs`) and the
//! scalar path (`simd.rs`) produce the same bits, and a row's result never depends on how many
//! rows share the call: prefill, chunked prefill and batched decode agree exactly.

mod acts;
mod arena;
mod formats;
mod gemm;
mod gemm_wide;
mod regions;
mod repack;
mod simd;

use rayon::prelude::*;

#[cfg(target_arch = "x86_64")]
use acts::Acts;

pub(crate) use arena::Carver;
pub use arena::Slab;
pub use formats::Format;
pub use simd::{Level, LEVEL};

pub const QK: usize = 32;

/// One weight matrix `[n, k]` in a supported GGUF block format.
pub struct QMatrix {
    format: Format,
    n: usize,
    k: usize,
    data: Slab,
}

/// A weight row unpacked to one i8 per value: the scalar reference path's form. 32-block
/// formats: float scale `d` and min `m` per block (`sc` all one). K formats: `d` and `m` (the
/// negated `dmin`) per 256-value super block at its index, integer scales per half block in
/// `sc` and integer mins per block in `mi`, all folded into the exact integer super-block sum.
#[derive(Clone)]
struct Unpacked {
    nb: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    m: Vec<f32>,
    sc: Vec<i32>,
    mi: Vec<i32>,
}

impl Unpacked {
    fn new(k: usize) -> Self {
        let nb = k / QK;
        Self {
            nb,
            q: vec![0; nb * QK],
            d: vec![0.0; nb],
            m: vec![0.0; nb],
            sc: vec![1; 2 * nb],
            mi: vec![0; nb],
        }
    }
}

/// A row of activations quantized to i8 values with one f32 scale per scale block (32
/// values, or 256 for the K formats: `Format::act_block`).
pub(crate) struct QuantRow {
    pub q: Vec<i8>,
    pub d: Vec<f32>,
    /// d * sum(q) per scale block: the block's sum, for formats with a min.
    pub s: Vec<f32>,
}

impl QMatrix {
    /// `data`: `n` rows of `k` values in GGUF block layout; kept repacked (`repack.rs`) in a
    /// mapping of its own.
    pub fn new(format: Format, n: usize, k: usize, data: Vec<u8>) -> Option<Self> {
        if data.len() != Self::gguf_bytes(format, n, k)? {
            return None;
        }
        let mut slab = Slab::alone(Self::packed_bytes(format, n, k)?).ok()?;
        slab[..data.len()].copy_from_slice(&data);
        Self::from_gguf(format, n, k, slab)
    }

    /// `slab`: `packed_bytes` long, the GGUF block layout of the `n` rows in its first
    /// `gguf_bytes` (a model's loader reads them there from the file); repacked in place.
    pub(crate) fn from_gguf(format: Format, n: usize, k: usize, mut data: Slab) -> Option<Self> {
        if data.len() != Self::packed_bytes(format, n, k)? {
            return None;
        }
        repack::repack(format, n, k, &mut data);
        Some(Self { format, n, k, data })
    }

    /// The GGUF's bytes of an `[n, k]` matrix (`None`: `k` not in whole blocks).
    pub(crate) fn gguf_bytes(format: Format, n: usize, k: usize) -> Option<usize> {
        let bv = format.block_values();
        k.is_multiple_of(bv)
            .then(|| n * (k / bv) * format.block_bytes())
    }

    /// The bytes it takes repacked (`from_gguf`'s slab).
    pub(crate) fn packed_bytes(format: Format, n: usize, k: usize) -> Option<usize> {
        Self::gguf_bytes(format, n, k).map(|_| repack::packed_bytes(format, n, k))
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
        self.format.dequantize(&self.gguf_row(row), self.k)
    }

    /// Row `row` in its GGUF block layout.
    fn gguf_row(&self, row: usize) -> Vec<u8> {
        repack::gguf_row(self.format, self.k, &self.data, row)
    }

    fn group_bytes(&self) -> usize {
        self.k / self.format.block_values() * self.format.super_bytes()
    }

    /// `x`: `[m, k]` row-major f32 -> `[m, n]`.
    pub fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        matmul_many(&[self], x, m).pop().unwrap_or_default()
    }

    /// The tile loop over groups `g0..g1` for activation rows `0..m` (`acts` quantized with
    /// this format's `act_block`), by `level`'s integer dots.
    #[cfg(target_arch = "x86_64")]
    fn run_groups(&self, level: Level, acts: &Acts, m: usize, g0: usize, g1: usize, dst: *mut f32) {
        let gb = self.group_bytes();
        let (one, pair) = if level.vnni() {
            (gemm::tile_vnni as TileFn, gemm::tile_vnni_pair as TileFn)
        } else {
            (gemm::tile_avx2 as TileFn, gemm::tile_avx2_pair as TileFn)
        };
        // Activation rows in chunks that stay in L2 while the task's groups pass over them.
        for c0 in (0..m).step_by(ACT_CHUNK) {
            let c1 = (c0 + ACT_CHUNK).min(m);
            let mut g = g0;
            while g < g1 {
                // Four groups per tile on the 512-bit path (two for the K formats, whose
                // four-group tile runs out of registers, and for calls of up to `PAIR_ROWS`),
                // then two, a task's odd last alone. The 256-bit paths take two groups for
                // single rows of the 32-block formats.
                let pairs = level.wide() || (m == 1 && !self.format.is_k());
                let span = match g1 - g {
                    4.. if level.wide() && !self.format.is_k() && m > PAIR_ROWS => 4,
                    2.. if pairs => 2,
                    _ => 1,
                };
                let tile: TileFn = match span {
                    4 => gemm_wide::tile_quad,
                    2 if level.wide() => gemm_wide::tile_pair,
                    2 => pair,
                    _ => one,
                };
                // The 512-bit tiles but q4_K's take sixteen rows at a time: each block's
                // weights are unpacked once for twice the rows.
                let wide_rows = level.wide() && span >= 2 && self.format != Format::Q4K;
                let group = &self.data[g * gb..(g + span) * gb];
                let col = g * repack::ROWS;
                let cols = (self.n - col).min(span * repack::ROWS);
                let mut i = c0;
                while i < c1 {
                    let mt = match c1 - i {
                        16.. if wide_rows => 16,
                        left => gemm::tile_rows(left),
                    };
                    // SAFETY: `level`'s features detected; tiles write disjoint [rows, cols]
                    // blocks of the `[m, n]` output at `dst`, inside it.
                    unsafe {
                        tile(&gemm::Tile {
                            f: self.format,
                            group,
                            acts,
                            i0: i,
                            mt,
                            out: dst.add(i * self.n + col),
                            ldo: self.n,
                            cols,
                            prefetch: i == c0 && m <= STREAM_ROWS,
                        })
                    };
                    i += mt;
                }
                g += span;
            }
        }
    }

    /// Scalar reference: each row back to GGUF bytes, unpacked, dotted in canonical order.
    fn matmul_portable(&self, x: &[f32], m: usize, out: &mut [f32]) {
        let width = self.format.act_block();
        let acts: Vec<QuantRow> = x
            .chunks_exact(self.k)
            .map(|r| quantize_row_by(r, width))
            .collect();
        debug_assert_eq!(acts.len(), m);
        let cols: Vec<Vec<f32>> = (0..self.n)
            .into_par_iter()
            .map(|j| {
                let mut un = Unpacked::new(self.k);
                self.format.unpack(&self.gguf_row(j), &mut un);
                acts.iter()
                    .map(|a| simd::dot_scalar(&un, a, self.format))
                    .collect()
            })
            .collect();
        for (j, col) in cols.iter().enumerate() {
            for (i, v) in col.iter().enumerate() {
                out[i * self.n + j] = *v;
            }
        }
    }
}

/// `x @ w^T` for several matrices with the same input width: the activations are quantized
/// once and all tiles run in one parallel call (q/k/v, gate/up), which matters for decode,
/// where each call is short.
pub fn matmul_many(ws: &[&QMatrix], x: &[f32], m: usize) -> Vec<Vec<f32>> {
    matmul_at(*LEVEL, ws, x, m)
}

/// `matmul_many` into the caller's buffers (`outs[i]` becomes `[m, n_i]`, every value
/// written): a forward pass keeps them from layer to layer, where fresh outputs of tens of MB
/// per call cost page faults and zeroing.
pub fn matmul_many_into(ws: &[&QMatrix], x: &[f32], m: usize, outs: &mut [Vec<f32>]) {
    matmul_into_at(*LEVEL, ws, x, m, outs)
}

/// `matmul_many` on the kernel path `level` (at most the detected one).
fn matmul_at(level: Level, ws: &[&QMatrix], x: &[f32], m: usize) -> Vec<Vec<f32>> {
    let mut outs = vec![Vec::new(); ws.len()];
    matmul_into_at(level, ws, x, m, &mut outs);
    outs
}

fn matmul_into_at(level: Level, ws: &[&QMatrix], x: &[f32], m: usize, outs: &mut [Vec<f32>]) {
    let Some(k) = ws.first().map(|w| w.k) else {
        return;
    };
    assert!(
        ws.iter().all(|w| w.k == k),
        "matmul_many input widths differ"
    );
    assert_eq!(x.len(), m * k, "matmul input shape");
    assert_eq!(outs.len(), ws.len(), "one output per matrix");
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        // Only growth writes (zeros); the kernels overwrite every value.
        out.resize(m * w.n, 0.0);
    }
    #[cfg(target_arch = "x86_64")]
    if level.avx2() {
        ACTS.with(|cell| match cell.try_borrow_mut() {
            Ok(mut acts) => matmul_simd(level, ws, x, m, &mut acts, outs),
            Err(_) => matmul_simd(level, ws, x, m, &mut Default::default(), outs),
        });
        return;
    }
    for (w, out) in ws.iter().zip(outs.iter_mut()) {
        w.matmul_portable(x, m, out);
    }
}

/// Activations quantized per 32 values and per 256 values (K formats).
#[cfg(target_arch = "x86_64")]
type ActsByWidth = [Acts; 2];

#[cfg(target_arch = "x86_64")]
fn width_slot(f: Format) -> usize {
    usize::from(f.act_block() != QK)
}

#[cfg(target_arch = "x86_64")]
fn matmul_simd(
    level: Level,
    ws: &[&QMatrix],
    x: &[f32],
    m: usize,
    acts: &mut ActsByWidth,
    outs: &mut [Vec<f32>],
) {
    for (slot, a) in acts.iter_mut().enumerate() {
        if let Some(w) = ws.iter().find(|w| width_slot(w.format) == slot) {
            a.fill(x, m, w.k, w.format.act_block());
        }
    }
    let acts = &*acts;
    let groups: Vec<usize> = ws.iter().map(|w| w.n.div_ceil(repack::ROWS)).collect();
    let threads = rayon::current_num_threads().max(1);
    let dsts: Vec<SendPtr> = outs.iter_mut().map(|o| SendPtr(o.as_mut_ptr())).collect();
    let run = |j: usize, g0: usize, g1: usize| {
        ws[j].run_groups(level, &acts[width_slot(ws[j].format)], m, g0, g1, dsts[j].0);
    };
    if m <= STREAM_ROWS {
        // The weights stream from memory once: each thread reads its own region.
        let regions = regions::Regions::new(groups.iter().sum(), threads, MIN_TASK);
        crate::pool::run(regions.parts(), &|w| {
            while let Some((a, b)) = regions.next(w) {
                for_pieces(&groups, a, b, &run);
            }
        });
        return;
    }
    let tasks = guided(&groups, threads);
    crate::pool::run(tasks.len(), &|t| {
        let (j, g0, g1) = tasks[t];
        run(j, g0, g1);
    });
}

/// `f(matrix, first group, end group)` for each matrix's part of the groups `a..b`, counted
/// over the matrices' groups one after another.
#[cfg(target_arch = "x86_64")]
fn for_pieces(groups: &[usize], a: usize, b: usize, f: &dyn Fn(usize, usize, usize)) {
    let mut base = 0;
    for (j, &n) in groups.iter().enumerate() {
        let (lo, hi) = (a.max(base), b.min(base + n));
        if lo < hi {
            f(j, lo - base, hi - base);
        }
        base += n;
    }
}

/// A tile kernel (`gemm`, `gemm_wide`).
#[cfg(target_arch = "x86_64")]
type TileFn = unsafe fn(&gemm::Tile);

/// Fewest groups in a task.
#[cfg(target_arch = "x86_64")]
const MIN_TASK: usize = 4;

/// Tasks `(matrix, first group, end group)` for calls of more than `STREAM_ROWS` rows
/// (prefill; shorter calls take `regions`), over the matrices' groups in order, largest first:
/// each takes `1 / (2 * threads)` of what is left (at least `MIN_TASK` groups), so the last
/// tasks are short and the threads finish close together (equal tasks left one thread waiting
/// for up to a whole task at the end of each call). A task never spans two matrices; which
/// thread runs a task never changes a bit.
#[cfg(target_arch = "x86_64")]
fn guided(groups: &[usize], threads: usize) -> Vec<(usize, usize, usize)> {
    let mut left: usize = groups.iter().sum();
    let (mut j, mut g) = (0, 0);
    let mut tasks = Vec::new();
    while left > 0 {
        // Whole multiples of `MIN_TASK`, so tasks keep to the four-group tiles.
        let mut need = (left / (2 * threads))
            .next_multiple_of(MIN_TASK)
            .max(MIN_TASK)
            .min(left);
        while need > 0 {
            while g == groups[j] {
                j += 1;
                g = 0;
            }
            let take = need.min(groups[j] - g);
            tasks.push((j, g, g + take));
            g += take;
            need -= take;
            left -= take;
        }
    }
    tasks
}

/// Activation rows per L2-resident chunk.
#[cfg(target_arch = "x86_64")]
const ACT_CHUNK: usize = 64;

/// Calls of at most this many rows (decode, served batches) read each group once, so they are
/// bound by the weights' stream: each thread takes its own region and prefetches ahead in it.
/// With guided tasks and no prefetch, 2-32 rows ran 5-40 % slower (q4_1 at 2 rows 1.9x the
/// time of one row); longer calls are bound by arithmetic and keep the guided tasks.
#[cfg(target_arch = "x86_64")]
const STREAM_ROWS: usize = ACT_CHUNK;

/// Calls of at most this many rows take two groups per 512-bit tile, not four: they are bound
/// by the stream, and two streams a thread read closer to a plain read's bandwidth than four
/// (two Zen 5 threads, 1-4 rows of q5_0, q8_0, q4_1: 0.03-0.12 more of it); from 8 rows the
/// four-group tile's shared broadcasts pay.
#[cfg(target_arch = "x86_64")]
const PAIR_ROWS: usize = 4;

#[cfg(target_arch = "x86_64")]
thread_local! {
    /// The calling thread's quantized activations, reused across calls.
    static ACTS: std::cell::RefCell<ActsByWidth> = Default::default();
}

#[cfg(target_arch = "x86_64")]
struct SendPtr(*mut f32);
// SAFETY: the tasks sharing it write disjoint parts of the buffer.
#[cfg(target_arch = "x86_64")]
unsafe impl Sync for SendPtr {}
#[cfg(target_arch = "x86_64")]
unsafe impl Send for SendPtr {}

/// `x` to i8 with one scale per `width` values.
pub(crate) fn quantize_row_by(x: &[f32], width: usize) -> QuantRow {
    let nb = x.len() / width;
    let mut r = QuantRow {
        q: vec![0; nb * width],
        d: vec![0.0; nb],
        s: vec![0.0; nb],
    };
    for (b, (xs, qs)) in x
        .chunks_exact(width)
        .zip(r.q.chunks_exact_mut(width))
        .enumerate()
    {
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
    r
}

#[cfg(test)]
mod tests;
