//! Quantized matrix multiply for the GGUF block formats (q4_0, q4_1, q5_0, q5_1, q8_0, q2_K,
//! q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs).
//!
//! Activations are quantized per row to 8-bit blocks of 32 with an f32 scale. For each block
//! pair the integer dot product is exact; blocks are then accumulated as floats in one
//! canonical order (block `b` into lane `b % 8`, lanes reduced by a fixed tree). The tiled
//! GEMMs on weights repacked at load by `repack.rs` (`x86/`: AVX2, AVX-512 VNNI; `arm/`: NEON,
//! dotprod, i8mm; `portable.rs` in plain Rust on any other CPU), picked at run time by
//! `level.rs`, and the scalar reference (`portable::dot_scalar`) produce the same bits, and a row's result never depends on how many
//! rows share the call: prefill, chunked prefill and batched decode agree exactly.
//!
//! Float matrices (F32, F16, BF16) run in `float.rs`, as floats, by the same rules.

mod act_quant;
mod arena;
#[cfg(target_arch = "aarch64")]
pub(crate) mod arm;
pub(crate) mod delta;
pub(crate) mod exp;
pub(crate) mod float;
pub(crate) mod float_tile;
mod formats;
pub(crate) mod gated;
mod level;
mod portable;
mod regions;
mod repack;
mod tile;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
use rayon::prelude::*;

use act_quant::Acts;

pub(crate) use arena::Carver;
pub use arena::Slab;
pub use float::{FloatMatrix, Floats};
pub use formats::Format;
pub(crate) use formats::IQ4;
pub use level::{Level, LEVEL};

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
/// negated `dmin`) per 256-value super block at its index, integer scales and mins per half
/// block in `sc` and `mi`, all folded into the exact integer super-block sum.
#[derive(Clone)]
struct Unpacked {
    // Read by the reference dot (tests); `dequantize` needs only the values and scales.
    #[cfg_attr(not(test), allow(dead_code))]
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
            mi: vec![0; 2 * nb],
        }
    }
}

/// A row of activations quantized to i8 values with one f32 scale per scale block (32
/// values, or 256 for the K formats: `Format::act_block`).
#[cfg(test)]
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

    /// The scalar reference the tests hold every path to: each row back to GGUF bytes,
    /// unpacked, dotted in canonical order (`portable::dot_scalar`).
    #[cfg(test)]
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
                    .map(|a| portable::dot_scalar(&un, a, self.format))
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
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => matmul_tiled(level, ws, x, m, &mut acts, outs),
        Err(_) => matmul_tiled(level, ws, x, m, &mut Default::default(), outs),
    });
}

/// Activations quantized per 32 values and per 256 values (K formats).
type ActsByWidth = [Acts; 2];

fn width_slot(f: Format) -> usize {
    usize::from(f.act_block() != QK)
}

/// The tiled GEMM on `level`'s kernels (`x86/`, `arm/`, or `portable.rs` on any CPU).
fn matmul_tiled(
    level: Level,
    ws: &[&QMatrix],
    x: &[f32],
    m: usize,
    acts: &mut ActsByWidth,
    outs: &mut [Vec<f32>],
) {
    for (slot, a) in acts.iter_mut().enumerate() {
        if let Some(w) = ws.iter().find(|w| width_slot(w.format) == slot) {
            a.fill(x, m, w.k, w.format.act_block(), quantizer(level));
        }
    }
    let acts = &*acts;
    let groups: Vec<usize> = ws.iter().map(|w| w.n.div_ceil(repack::ROWS)).collect();
    let threads = rayon::current_num_threads().max(1);
    let dsts: Vec<SendPtr> = outs.iter_mut().map(|o| SendPtr(o.as_mut_ptr())).collect();
    let run = |j: usize, g0: usize, g1: usize| {
        let acts = &acts[width_slot(ws[j].format)];
        if !level.simd() {
            return portable::run_groups(ws[j], acts, m, g0, g1, dsts[j].0);
        }
        #[cfg(target_arch = "x86_64")]
        x86::run_groups(ws[j], level, acts, m, g0, g1, dsts[j].0);
        #[cfg(target_arch = "aarch64")]
        arm::run_groups(ws[j], level, acts, m, g0, g1, dsts[j].0);
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

/// Fewest groups in a task.
const MIN_TASK: usize = 4;

/// Tasks `(matrix, first group, end group)` for calls of more than `STREAM_ROWS` rows
/// (prefill; shorter calls take `regions`), over the matrices' groups in order, largest first:
/// each takes `1 / (2 * threads)` of what is left (at least `MIN_TASK` groups), so the last
/// tasks are short and the threads finish close together (equal tasks left one thread waiting
/// for up to a whole task at the end of each call). A task never spans two matrices; which
/// thread runs a task never changes a bit.
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
const ACT_CHUNK: usize = 64;

/// Calls of at most this many rows (decode, served batches) read each group once, so they are
/// bound by the weights' stream: each thread takes its own region and prefetches ahead in it.
/// With guided tasks and no prefetch, 2-32 rows ran 5-40 % slower (q4_1 at 2 rows 1.9x the
/// time of one row); longer calls are bound by arithmetic and keep the guided tasks.
const STREAM_ROWS: usize = ACT_CHUNK;

thread_local! {
    /// The calling thread's quantized activations, reused across calls.
    static ACTS: std::cell::RefCell<ActsByWidth> = Default::default();
}

struct SendPtr(*mut f32);
// SAFETY: the tasks sharing it write disjoint parts of the buffer.
unsafe impl Sync for SendPtr {}
unsafe impl Send for SendPtr {}

/// `g = silu(g) * u` in place (the gated FFN), with `exp_neg`: the same bits on every path.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    gated_mul::<false>(g, u)
}

/// `x = cap * tanh(x / cap)` in place (Gemma 2's soft-capping of logits and scores): the
/// tanh from `exp_neg`, scalar, so the same bits on every path.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = softcap1(*v, cap);
    }
}

#[inline(always)]
pub(crate) fn softcap1(v: f32, cap: f32) -> f32 {
    let y = v / cap;
    let t = exp::exp_neg(-2.0 * y.abs());
    let th = (1.0 - t) / (1.0 + t);
    cap * if y < 0.0 { -th } else { th }
}

/// `g = gelu_tanh(g) * u` in place (Gemma's gated FFN): the same bits on every path.
pub fn gelu_mul(g: &mut [f32], u: &[f32]) {
    gated_mul::<true>(g, u)
}

/// `g = x * sigmoid(z) * u` with `z = x` (SiLU) or GELU's `z = x (A + B x^2)`.
fn gated_mul<const GELU: bool>(g: &mut [f32], u: &[f32]) {
    assert_eq!(g.len(), u.len(), "gated activation lengths");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if LEVEL.wide() {
        // SAFETY: AVX-512 F and AVX2 detected; whole 16- then 8-lane chunks only.
        done = unsafe { x86::gated::gated_mul_avx512::<GELU>(g, u) };
        done += unsafe { x86::gated::gated_mul_avx2::<GELU>(&mut g[done..], &u[done..]) };
    } else if LEVEL.avx2() {
        // SAFETY: AVX2 detected; whole 8-lane chunks only.
        done = unsafe { x86::gated::gated_mul_avx2::<GELU>(g, u) };
    }
    #[cfg(target_arch = "aarch64")]
    if LEVEL.neon() {
        // SAFETY: Advanced SIMD is part of every aarch64 target; whole 4-lane chunks only.
        done = unsafe { arm::gated::gated_mul_neon::<GELU>(g, u) };
    }
    gated::gated_tail::<GELU>(&mut g[done..], &u[done..]);
}

/// One token of the gated delta rule on a value head's matrix `m` (`delta.rs`), each row's
/// output into `o`: the same bits on every path.
pub fn delta_step(m: &mut [f32], s: &delta::Step, o: &mut [f32]) {
    delta_step_at(*LEVEL, m, s, o)
}

/// `delta_step` on the kernel path `level` (at most the detected one).
fn delta_step_at(level: Level, m: &mut [f32], s: &delta::Step, o: &mut [f32]) {
    let d = s.k.len().max(1);
    assert!(
        s.q.len() == s.k.len() && s.v.len() == m.len() / d && o.len() == m.len() / d,
        "delta step shapes"
    );
    // Rows the SIMD path did (four at a time); the portable step does the rest.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2 detected (a level is at most the detected one).
    let done = match level.avx2() {
        true => unsafe { x86::delta::step_avx2(m, s, o) },
        false => 0,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = level;
        0
    };
    delta::step_rows(m, s, o, done);
}

/// The activation quantizer of `level`'s kernels.
fn quantizer(level: Level) -> act_quant::Quantizer {
    #[cfg(target_arch = "x86_64")]
    if level.simd() {
        return x86::act_quant::quantize;
    }
    #[cfg(target_arch = "aarch64")]
    if level.simd() {
        return arm::act_quant::quantize;
    }
    let _ = level;
    act_quant::quantize_scalar
}

/// `x` to i8 with one scale per `width` values.
#[cfg(test)]
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
        // A subnormal scale's inverse is infinite: such a block quantizes to zeros on every path.
        let id = if d > 0.0 && (1.0 / d).is_finite() {
            1.0 / d
        } else {
            0.0
        };
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
