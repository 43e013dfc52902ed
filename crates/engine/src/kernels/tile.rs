//! What one GEMM tile of any ISA takes (`x86/`, `arm/`), and the tile heights.

use super::act_quant::Acts;
use super::Format;

/// One tile: output rows `i0..i0 + mt` (`mt` from `tile_rows`, or 16 on the 512-bit 32-block
/// tiles) of one repacked `group` of format `f`, written to `out` (row stride `ldo`, `cols`
/// valid columns from column 0).
pub(crate) struct Tile<'a> {
    pub f: Format,
    pub group: &'a [u8],
    pub acts: &'a Acts,
    pub i0: usize,
    pub mt: usize,
    pub out: *mut f32,
    pub ldo: usize,
    pub cols: usize,
    /// Prefetch the run of groups ahead: the first tile over each group of a call that
    /// streams its weights (`run_groups`). Single-row tiles always do.
    pub prefetch: bool,
}

/// The tile height for `left` remaining rows: up to 8 rows reuse one block's unpacked weights;
/// powers of two, so four kernels cover any count.
pub(crate) fn tile_rows(left: usize) -> usize {
    match left {
        8.. => 8,
        4..=7 => 4,
        2..=3 => 2,
        _ => 1,
    }
}
