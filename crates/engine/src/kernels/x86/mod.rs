//! The x86 kernels: the GEMM on AVX2 / AVX-512 VNNI (256-bit tiles, `gemm.rs`) and on 512-bit
//! vectors (`gemm_wide.rs`), the float GEMM's tiles (`float.rs`), the activation quantizers
//! (`act_quant.rs`), exp (`exp.rs`), the gated activations (`gated.rs`) and the delta rule's
//! step (`delta.rs`).

pub(crate) mod act_quant;
pub(crate) mod delta;
pub(crate) mod exp;
pub(crate) mod float;
pub(crate) mod gated;
mod gemm;
mod gemm_wide;

use std::cell::RefCell;

use super::act_quant::Acts;
use super::{repack, Format, Level, QMatrix, ACT_CHUNK, STREAM_ROWS};

/// Whether `f`'s 512-bit tiles take sixteen activation rows: all but the K formats with mins,
/// whose per-row super-block sums would spill, and iq4_xs, whose sixteen-row tile spilled too
/// (eight rows: Qwen 1.5B IQ4_XS prefill 7-10 % faster on the Xeon).
pub(crate) fn sixteen_rows(f: Format) -> bool {
    !matches!(f, Format::Q2K | Format::Q4K | Format::Q5K | Format::IQ4XS)
}

/// One 512-bit vector (or two 256-bit ones), aligned as one.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Line([u8; 64]);

thread_local! {
    /// This thread's unpacked groups (`run_groups`): 8 x k bytes a group.
    static PLANES: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// A tile kernel (`gemm`, `gemm_wide`).
type TileFn = unsafe fn(&gemm::Tile);

/// A tile kernel over its groups' unpacked weights.
type PlanesFn = unsafe fn(&gemm::Tile, &[Line]);

/// Calls of at most this many rows take two groups per 512-bit tile, not four: they are bound
/// by the stream, and two streams a thread read closer to a plain read's bandwidth than four
/// (two Zen 5 threads, 1-4 rows of q5_0, q8_0, q4_1: 0.03-0.12 more of it); from 8 rows the
/// four-group tile's shared broadcasts pay.
const PAIR_ROWS: usize = 4;

/// The tile loop over `w`'s groups `g0..g1` for activation rows `0..m` (`acts` quantized
/// with its format's `act_block`), by `level`'s integer dots.
pub(crate) fn run_groups(
    w: &QMatrix,
    level: Level,
    acts: &Acts,
    m: usize,
    g0: usize,
    g1: usize,
    dst: *mut f32,
) {
    let gb = w.group_bytes();
    let (one, pair, one_planes) = if level.vnni() {
        (
            gemm::tile_vnni as TileFn,
            gemm::tile_vnni_pair as TileFn,
            gemm::tile_vnni_planes as PlanesFn,
        )
    } else {
        (
            gemm::tile_avx2 as TileFn,
            gemm::tile_avx2_pair as TileFn,
            gemm::tile_avx2_planes as PlanesFn,
        )
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
            let pairs = level.wide() || (m == 1 && !w.format.is_k());
            let span = match g1 - g {
                4.. if level.wide() && !w.format.is_k() && m > PAIR_ROWS => 4,
                2.. if pairs => 2,
                _ => 1,
            };
            let tile: TileFn = match span {
                4 => gemm_wide::tile_quad,
                2 if level.wide() => gemm_wide::tile_pair,
                2 => pair,
                _ => one,
            };
            // The 512-bit tiles but those of the K formats with mins take sixteen rows: each
            // block's weights are unpacked once for twice the rows.
            let wide_rows = level.wide() && span >= 2 && sixteen_rows(w.format);
            let group = &w.data[g * gb..(g + span) * gb];
            let col = g * repack::ROWS;
            let cols = (w.n - col).min(span * repack::ROWS);
            // The eight-row tiles of a chunk of more rows read their groups unpacked once
            // (`unpack_pair`, `unpack_group`).
            let unpacked = gemm::unpacks(w.format) && !wide_rows && c1 - c0 > 8;
            if unpacked {
                let (nb, prefetch) = (acts.nb, m <= STREAM_ROWS);
                // SAFETY: `level`'s features detected; `group` is `span` groups of `nb` blocks.
                PLANES.with_borrow_mut(|p| unsafe {
                    p.resize(4 * span * nb, Line([0; 64]));
                    if span == 2 {
                        gemm_wide::unpack_pair(w.format, group, nb, prefetch, p)
                    } else {
                        gemm::unpack_group(w.format, group, nb, prefetch, p)
                    }
                });
            }
            let mut i = c0;
            while i < c1 {
                let mt = match c1 - i {
                    16.. if wide_rows => 16,
                    left => gemm::tile_rows(left),
                };
                // SAFETY: `level`'s features detected; tiles write disjoint [rows, cols]
                // blocks of the `[m, n]` output at `dst`, inside it.
                unsafe {
                    let t = gemm::Tile {
                        f: w.format,
                        group,
                        acts,
                        i0: i,
                        mt,
                        out: dst.add(i * w.n + col),
                        ldo: w.n,
                        cols,
                        prefetch: i == c0 && m <= STREAM_ROWS,
                    };
                    if unpacked {
                        let planes: PlanesFn = match span {
                            2 => gemm_wide::tile_pair_planes,
                            _ => one_planes,
                        };
                        PLANES.with_borrow(|p| planes(&t, p));
                    } else {
                        tile(&t);
                    }
                };
                i += mt;
            }
            g += span;
        }
    }
}
