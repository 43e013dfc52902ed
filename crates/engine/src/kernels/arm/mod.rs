//! The aarch64 kernels: the GEMM over repacked groups on Advanced SIMD (`gemm.rs`: widening
//! multiplies on ARMv8.0, `sdot` with dotprod, `smmla` with i8mm), the float GEMM's tiles
//! (`float.rs`), the activation quantizer (`act_quant.rs`), exp (`exp.rs`) and the gated
//! activations (`gated.rs`).

pub(crate) mod act_quant;
pub(crate) mod exp;
pub(crate) mod float;
pub(crate) mod gated;
mod gemm;

use super::act_quant::Acts;
use super::{repack, Level, QMatrix, ACT_CHUNK, STREAM_ROWS};

/// The tile loop over `w`'s groups `g0..g1` for activation rows `0..m` (`acts` quantized
/// with its format's `act_block`), by `level`'s integer dots: one group (8 weight rows) by up
/// to 8 activation rows a tile, the rows in chunks that stay in cache while the groups pass.
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
    let tile: gemm::TileFn = match level {
        Level::I8mm => gemm::tile_i8mm,
        Level::Dotprod => gemm::tile_dotprod,
        Level::Neon => gemm::tile_neon,
        Level::Portable | Level::Avx2 | Level::Avx512Vnni | Level::Avx512 => {
            unreachable!("{level:?} runs no Arm tile")
        }
    };
    for c0 in (0..m).step_by(ACT_CHUNK) {
        let c1 = (c0 + ACT_CHUNK).min(m);
        for g in g0..g1 {
            let group = &w.data[g * gb..(g + 1) * gb];
            let col = g * repack::ROWS;
            let cols = (w.n - col).min(repack::ROWS);
            let mut i = c0;
            while i < c1 {
                let mt = gemm::tile_rows(c1 - i);
                // SAFETY: `level`'s features detected; tiles write disjoint [rows, cols]
                // blocks of the `[m, n]` output at `dst`, inside it.
                unsafe {
                    tile(&gemm::Tile {
                        f: w.format,
                        group,
                        acts,
                        i0: i,
                        mt,
                        out: dst.add(i * w.n + col),
                        ldo: w.n,
                        cols,
                        prefetch: i == c0 && m <= STREAM_ROWS,
                    })
                };
                i += mt;
            }
        }
    }
}
