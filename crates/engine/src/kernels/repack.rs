//! GGUF rows repacked once at load into groups of 8 interleaved rows, the layout the GEMM
//! kernels read (`x86/gemm.rs`, `arm/gemm.rs`, `portable.rs`): one 32-byte load gives 4
//! consecutive values of each of the 8 rows, so a `maddubs` (or two `sdot`) against 4
//! broadcast activation bytes yields all 8 rows' partial dots with no horizontal reduction.
//! Nibbles stay packed; the repacked matrix has the GGUF's size (q4_K +2.8 %, q5_K +2.3 %:
//! unpacked 6-bit scales), and the GGUF bytes of any row can be rebuilt exactly (`gguf_row`), which the
//! tests' reference dot and the embedding lookup use.
//!
//! A group is a run of super units (one 32-block, or a 256-value K block of 8 blocks):
//! `[header][plane of block 0]..[plane of block bps-1]`.
//!
//! - header: q4_0/q5_0/q8_0/iq4_nl `d[8]` f16; q4_1/q5_1 `d[8] m[8]` f16; q4_K, q5_K
//!   `d[8] dmin[8]` f16, `sc[8 blocks][8 rows]` u8, `m[8][8]` u8; q6_K `d[8]` f16,
//!   `sc[16 halves][8 rows]` i8; q3_K as q6_K (its 6-bit scales less 32); q2_K `d[8] dmin[8]`
//!   f16, `scale | min << 4[16 halves][8 rows]` u8 (as stored); iq4_xs `d[8]` f16,
//!   `sc[8 blocks][8 rows]` i8 (signed).
//! - the iq4 formats keep their 4-bit indices into `IQ4`; the kernels look the values up.
//! - plane of a 32-block (values `v` unsigned, before any zero point), chunks of 32 bytes,
//!   chunk byte `4r + t` for row `r`:
//!   - q4_0, q4_1, q4_K, iq4_nl, iq4_xs, q3_K (3-bit values in nibbles): chunk `j` (0..4) =
//!     `v_r[4j + t] | v_r[16 + 4j + t] << 4`.
//!   - q5_0, q5_1, q5_K (5-bit values): chunk `j` (0..4) = `v_r[4j + t] | (v_r[16 + 4j + t] & 7) << 5`,
//!     chunk 4 bits `2i..2i + 2` = `v_r[16 + 4i + t] >> 3`.
//!   - q6_K (6-bit values): chunk `j` (0..4) = `v_r[4j + t] | (v_r[16 + 4j + t] & 3) << 6`,
//!     chunk `4 + c` (c 0..2) = `v_r[16 + 8c + t] >> 2 | (v_r[20 + 8c + t] >> 2) << 4`.
//!   - q8_0: chunk `j` (0..8) = `v_r[4j + t]`.
//!   - q2_K (2-bit values): chunk `c` (0..2) = `v_r[16c + t] | v_r[16c + 4 + t] << 2 |
//!     v_r[16c + 8 + t] << 4 | v_r[16c + 12 + t] << 6`.
//!
//!   The first four values of every byte of the wide formats come out with one `and`, the
//!   other four with two shifts, two `and`s and an `or`, with no bit crossing a byte boundary
//!   that a mask does not clear: ~24 vector operations per 32-block where a separate plane
//!   of high bits took ~35, the difference in decode's share of the arithmetic.

// Byte and value indices are the layout; index loops say it most plainly.
#![allow(clippy::needless_range_loop)]

use super::formats::{
    iq4xs_scale, k_values, q2k_values, q3k_scale, q3k_values, q4k_scale_min, Bits, Format, Plane,
};
use super::QK;
use rayon::prelude::*;

/// Rows interleaved per group.
pub const ROWS: usize = 8;

impl Format {
    /// 32-blocks per super unit.
    pub(crate) fn blocks_per_super(self) -> usize {
        self.block_values() / QK
    }

    pub(crate) fn header_bytes(self) -> usize {
        match self {
            Format::Q4_0 | Format::Q5_0 | Format::Q8_0 | Format::IQ4NL => 16,
            Format::IQ4XS => 16 + 64,
            Format::Q4_1 | Format::Q5_1 => 32,
            Format::Q4K | Format::Q5K | Format::Q2K => 32 + 128,
            Format::Q3K | Format::Q6K => 16 + 128,
        }
    }

    /// Bytes of one 32-block's planes for a group.
    pub(crate) fn plane_bytes(self) -> usize {
        match self {
            Format::Q4_0
            | Format::Q4_1
            | Format::Q4K
            | Format::IQ4NL
            | Format::IQ4XS
            | Format::Q3K => 128,
            Format::Q5_0 | Format::Q5_1 | Format::Q5K => 160,
            Format::Q2K => 64,
            Format::Q6K => 192,
            Format::Q8_0 => 256,
        }
    }

    pub(crate) fn super_bytes(self) -> usize {
        self.header_bytes() + self.blocks_per_super() * self.plane_bytes()
    }

    /// Unsigned quant values of one GGUF block (q8_0: the i8 bit patterns; the iq4 formats:
    /// indices into `IQ4`).
    fn values(self, blk: &[u8], v: &mut [u8]) {
        match self {
            Format::Q4_0 | Format::Q4_1 | Format::IQ4NL => {
                let qs = &blk[self.block_bytes() - 16..];
                for l in 0..16 {
                    v[l] = qs[l] & 15;
                    v[l + 16] = qs[l] >> 4;
                }
            }
            Format::Q5_0 | Format::Q5_1 => {
                let at = self.block_bytes() - 20;
                let qh = u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                let qs = &blk[at + 4..];
                for l in 0..16 {
                    v[l] = (qs[l] & 15) | ((((qh >> l) & 1) as u8) << 4);
                    v[l + 16] = (qs[l] >> 4) | ((((qh >> (l + 16)) & 1) as u8) << 4);
                }
            }
            Format::Q8_0 => v[..32].copy_from_slice(&blk[2..34]),
            Format::Q4K | Format::Q5K => k_values(self, blk, v),
            Format::Q3K => q3k_values(blk, v),
            Format::Q2K => q2k_values(blk, v),
            Format::IQ4XS => {
                for (j, qs) in blk[8..136].chunks_exact(16).enumerate() {
                    for (l, &x) in qs.iter().enumerate() {
                        v[32 * j + l] = x & 15;
                        v[32 * j + l + 16] = x >> 4;
                    }
                }
            }
            Format::Q6K => {
                let (ql, qh) = (&blk[0..128], &blk[128..192]);
                for half in 0..2 {
                    let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
                    let y = &mut v[half * 128..];
                    for l in 0..32 {
                        y[l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
                        y[l + 32] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
                        y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                        y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
                    }
                }
            }
        }
    }

    /// The inverse of `values`: quant bytes of one GGUF block from its values.
    fn encode(self, v: &[u8], blk: &mut [u8]) {
        match self {
            Format::Q4_0 | Format::Q4_1 | Format::IQ4NL => {
                let at = self.block_bytes() - 16;
                for l in 0..16 {
                    blk[at + l] = v[l] | (v[l + 16] << 4);
                }
            }
            Format::Q5_0 | Format::Q5_1 => {
                let at = self.block_bytes() - 20;
                let mut qh = 0u32;
                for l in 0..32 {
                    qh |= (((v[l] >> 4) & 1) as u32) << l;
                }
                blk[at..at + 4].copy_from_slice(&qh.to_le_bytes());
                for l in 0..16 {
                    blk[at + 4 + l] = (v[l] & 15) | ((v[l + 16] & 15) << 4);
                }
            }
            Format::Q8_0 => blk[2..34].copy_from_slice(&v[..32]),
            Format::Q4K | Format::Q5K => {
                let at = if self == Format::Q5K { 48 } else { 16 };
                for c in 0..4 {
                    for l in 0..32 {
                        let (a, b) = (v[c * 64 + l], v[c * 64 + 32 + l]);
                        blk[at + 32 * c + l] = (a & 15) | (b & 15) << 4;
                    }
                }
                if self == Format::Q5K {
                    for l in 0..32 {
                        blk[16 + l] = (0..4).fold(0, |h, c| {
                            h | (v[c * 64 + l] >> 4) << (2 * c)
                                | (v[c * 64 + 32 + l] >> 4) << (2 * c + 1)
                        });
                    }
                }
            }
            Format::Q2K => {
                blk[16..80].fill(0);
                for n in 0..2 {
                    for j in 0..4 {
                        for l in 0..32 {
                            blk[16 + 32 * n + l] |= v[128 * n + 32 * j + l] << (2 * j);
                        }
                    }
                }
            }
            Format::Q3K => {
                blk[..96].fill(0);
                for n in 0..2 {
                    for j in 0..4 {
                        for l in 0..32 {
                            let x = v[128 * n + 32 * j + l];
                            blk[32 + 32 * n + l] |= (x & 3) << (2 * j);
                            blk[l] |= (x >> 2) << (4 * n + j);
                        }
                    }
                }
            }
            Format::IQ4XS => {
                for j in 0..8 {
                    for l in 0..16 {
                        blk[8 + 16 * j + l] = v[32 * j + l] | v[32 * j + l + 16] << 4;
                    }
                }
            }
            Format::Q6K => {
                for half in 0..2 {
                    let y = &v[half * 128..];
                    for l in 0..32 {
                        blk[half * 64 + l] = (y[l] & 15) | ((y[l + 64] & 15) << 4);
                        blk[half * 64 + l + 32] = (y[l + 32] & 15) | ((y[l + 96] & 15) << 4);
                        blk[128 + half * 32 + l] = (y[l] >> 4)
                            | ((y[l + 32] >> 4) << 2)
                            | ((y[l + 64] >> 4) << 4)
                            | ((y[l + 96] >> 4) << 6);
                    }
                }
            }
        }
    }
}

/// Repacks `[n, k]` GGUF rows in place; rows past `n` (up to a multiple of 8) are zero.
/// A group of 8 GGUF rows is no larger than its repacked form: where it is smaller (q4_K, q5_K),
/// the groups are first moved apart to their repacked places, the last first. Then every
/// group is rewritten from a copy of its own rows, the groups in parallel (a fifth of a
/// model's load when one thread did them all): the matrix is never held twice.
pub(crate) fn repack(f: Format, n: usize, k: usize, data: &mut [u8]) {
    let (bv, bb) = (f.block_values(), f.block_bytes());
    let nsup = k / bv;
    let groups = n.div_ceil(ROWS);
    let (src_group, dst_group) = (ROWS * nsup * bb, nsup * f.super_bytes());
    let real = n * nsup * bb;
    assert_eq!(data.len(), packed_bytes(f, n, k), "repack buffer size");
    if dst_group > src_group {
        for g in (0..groups).rev() {
            let from = (g * src_group).min(real)..((g + 1) * src_group).min(real);
            data.copy_within(from, g * dst_group);
        }
    }
    data.par_chunks_mut(dst_group).enumerate().for_each_init(
        || vec![0u8; src_group],
        |rows, (g, dst)| {
            let len = ((g + 1) * src_group).min(real) - g * src_group;
            rows[..len].copy_from_slice(&dst[..len]);
            repack_group(f, nsup, &rows[..len], dst);
        },
    );
}

/// Bytes of an `[n, k]` matrix repacked: whole groups of `ROWS` rows (the last padded with
/// zero rows), at least the GGUF's bytes.
pub(crate) fn packed_bytes(f: Format, n: usize, k: usize) -> usize {
    n.div_ceil(ROWS) * (k / f.block_values()) * f.super_bytes()
}

/// One group: `rows` holds its real rows' GGUF bytes (the rest are zero rows); `dst` its
/// repacked bytes.
fn repack_group(f: Format, nsup: usize, rows: &[u8], dst: &mut [u8]) {
    let bb = f.block_bytes();
    let real = rows.len() / (nsup * bb);
    let mut vals = [[0u8; 256]; ROWS];
    let zero = [0u8; 210];
    for (s, sup) in dst.chunks_exact_mut(f.super_bytes()).enumerate() {
        let blks: [&[u8]; ROWS] = std::array::from_fn(|r| {
            let at = (r * nsup + s) * bb;
            if r < real {
                &rows[at..at + bb]
            } else {
                &zero[..bb]
            }
        });
        for (r, blk) in blks.iter().enumerate() {
            f.values(blk, &mut vals[r]);
        }
        write_header(f, &blks, &mut sup[..f.header_bytes()]);
        let planes = &mut sup[f.header_bytes()..];
        planes.fill(0);
        for (b, p) in planes.chunks_exact_mut(f.plane_bytes()).enumerate() {
            let v: [&[u8]; ROWS] = std::array::from_fn(|r| &vals[r][b * QK..(b + 1) * QK]);
            write_plane(f, &v, p);
        }
    }
}

/// The GGUF bytes of row `row` of a repacked matrix (exact inverse of `repack`).
pub(crate) fn gguf_row(f: Format, k: usize, packed: &[u8], row: usize) -> Vec<u8> {
    let (bv, bb) = (f.block_values(), f.block_bytes());
    let nsup = k / bv;
    let (g, r) = (row / ROWS, row % ROWS);
    let group = &packed[g * nsup * f.super_bytes()..(g + 1) * nsup * f.super_bytes()];
    let mut out = vec![0u8; nsup * bb];
    let mut v = [0u8; 256];
    for (sup, blk) in group
        .chunks_exact(f.super_bytes())
        .zip(out.chunks_exact_mut(bb))
    {
        read_header(f, &sup[..f.header_bytes()], r, blk);
        let planes = &sup[f.header_bytes()..];
        for (b, p) in planes.chunks_exact(f.plane_bytes()).enumerate() {
            read_plane(f, p, r, &mut v[b * QK..(b + 1) * QK]);
        }
        f.encode(&v, blk);
    }
    out
}

/// Where a block's f16 `d` is.
fn d_at(f: Format) -> usize {
    match f {
        Format::Q6K => 208,
        Format::Q3K => 108,
        Format::Q2K => 80,
        Format::Q4_0
        | Format::Q4_1
        | Format::Q5_0
        | Format::Q5_1
        | Format::Q8_0
        | Format::Q4K
        | Format::Q5K
        | Format::IQ4NL
        | Format::IQ4XS => 0,
    }
}

fn write_header(f: Format, blks: &[&[u8]; ROWS], h: &mut [u8]) {
    let d_at = d_at(f);
    for (r, blk) in blks.iter().enumerate() {
        h[2 * r..2 * r + 2].copy_from_slice(&blk[d_at..d_at + 2]);
        match f {
            Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K => {
                h[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[2..4])
            }
            Format::Q2K => h[16 + 2 * r..18 + 2 * r].copy_from_slice(&blk[82..84]),
            // No min.
            Format::Q4_0
            | Format::Q5_0
            | Format::Q8_0
            | Format::Q3K
            | Format::Q6K
            | Format::IQ4NL
            | Format::IQ4XS => {}
        }
        match f {
            Format::Q4K | Format::Q5K => {
                for j in 0..8 {
                    let (sc, m) = q4k_scale_min(&blk[4..16], j);
                    h[32 + 8 * j + r] = sc;
                    h[96 + 8 * j + r] = m;
                }
            }
            Format::Q6K => {
                for j in 0..16 {
                    h[16 + 8 * j + r] = blk[192 + j];
                }
            }
            // A byte per half block, as stored.
            Format::Q2K => {
                for j in 0..16 {
                    h[32 + 8 * j + r] = blk[j];
                }
            }
            // The signed scales, as i8.
            Format::Q3K => {
                for j in 0..16 {
                    h[16 + 8 * j + r] = q3k_scale(blk, j).wrapping_sub(32);
                }
            }
            Format::IQ4XS => {
                for j in 0..8 {
                    h[16 + 8 * j + r] = iq4xs_scale(blk, j).wrapping_sub(32);
                }
            }
            // One scale per block: `d` alone.
            Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q8_0
            | Format::IQ4NL => {}
        }
    }
}

fn read_header(f: Format, h: &[u8], r: usize, blk: &mut [u8]) {
    let d_at = d_at(f);
    blk[d_at..d_at + 2].copy_from_slice(&h[2 * r..2 * r + 2]);
    match f {
        Format::Q4_1 | Format::Q5_1 | Format::Q4K | Format::Q5K => {
            blk[2..4].copy_from_slice(&h[16 + 2 * r..18 + 2 * r])
        }
        Format::Q2K => blk[82..84].copy_from_slice(&h[16 + 2 * r..18 + 2 * r]),
        Format::Q4_0
        | Format::Q5_0
        | Format::Q8_0
        | Format::Q3K
        | Format::Q6K
        | Format::IQ4NL
        | Format::IQ4XS => {}
    }
    match f {
        Format::Q4K | Format::Q5K => {
            let sc: [u8; 8] = std::array::from_fn(|j| h[32 + 8 * j + r]);
            let m: [u8; 8] = std::array::from_fn(|j| h[96 + 8 * j + r]);
            // ggml's 12-byte packing of eight 6-bit scales and mins.
            let s = &mut blk[4..16];
            for j in 0..4 {
                s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
                s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
                s[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4);
            }
        }
        Format::Q6K => {
            for j in 0..16 {
                blk[192 + j] = h[16 + 8 * j + r];
            }
        }
        Format::Q2K => {
            for j in 0..16 {
                blk[j] = h[32 + 8 * j + r];
            }
        }
        Format::Q3K => {
            let ls: [u8; 16] = std::array::from_fn(|j| h[16 + 8 * j + r].wrapping_add(32));
            let s = &mut blk[96..108];
            s.fill(0);
            for i in 0..16 {
                if i < 8 {
                    s[i] |= ls[i] & 15;
                } else {
                    s[i - 8] |= (ls[i] & 15) << 4;
                }
                s[8 + i % 4] |= (ls[i] >> 4) << (2 * (i / 4));
            }
        }
        Format::IQ4XS => {
            let ls: [u8; 8] = std::array::from_fn(|j| h[16 + 8 * j + r].wrapping_add(32));
            let mut high = 0u16;
            for j in 0..8 {
                high |= ((ls[j] >> 4) as u16) << (2 * j);
            }
            blk[2..4].copy_from_slice(&high.to_le_bytes());
            for j in 0..4 {
                blk[4 + j] = (ls[2 * j] & 15) | (ls[2 * j + 1] & 15) << 4;
            }
        }
        Format::Q4_0
        | Format::Q4_1
        | Format::Q5_0
        | Format::Q5_1
        | Format::Q8_0
        | Format::IQ4NL => {}
    }
}

fn write_plane(f: Format, v: &[&[u8]; ROWS], p: &mut [u8]) {
    let bits = match f.plane() {
        Plane::TwoBit => {
            for (r, vr) in v.iter().enumerate() {
                for j in 0..8 {
                    for t in 0..4 {
                        p[32 * (j / 4) + 4 * r + t] |= vr[4 * j + t] << (2 * (j % 4));
                    }
                }
            }
            return;
        }
        Plane::Bytes => {
            for j in 0..8 {
                for (r, vr) in v.iter().enumerate() {
                    for t in 0..4 {
                        p[32 * j + 4 * r + t] = vr[4 * j + t];
                    }
                }
            }
            return;
        }
        Plane::Split(bits) => bits,
    };
    for (r, vr) in v.iter().enumerate() {
        for t in 0..4 {
            let at = 4 * r + t;
            for j in 0..4 {
                let (a, b) = (vr[4 * j + t], vr[16 + 4 * j + t]);
                match bits {
                    Bits::Four => p[32 * j + at] = a | b << 4,
                    Bits::Five => {
                        p[32 * j + at] = a | (b & 7) << 5;
                        p[128 + at] |= (b >> 3) << (2 * j);
                    }
                    Bits::Six => {
                        p[32 * j + at] = a | (b & 3) << 6;
                        p[128 + 32 * (j / 2) + at] |= (b >> 2) << (4 * (j % 2));
                    }
                }
            }
        }
    }
}

fn read_plane(f: Format, p: &[u8], r: usize, v: &mut [u8]) {
    let bits = match f.plane() {
        Plane::TwoBit => {
            for j in 0..8 {
                for t in 0..4 {
                    v[4 * j + t] = (p[32 * (j / 4) + 4 * r + t] >> (2 * (j % 4))) & 3;
                }
            }
            return;
        }
        Plane::Bytes => {
            for j in 0..8 {
                for t in 0..4 {
                    v[4 * j + t] = p[32 * j + 4 * r + t];
                }
            }
            return;
        }
        Plane::Split(bits) => bits,
    };
    for t in 0..4 {
        let at = 4 * r + t;
        for j in 0..4 {
            let x = p[32 * j + at];
            (v[4 * j + t], v[16 + 4 * j + t]) = match bits {
                Bits::Four => (x & 15, x >> 4),
                Bits::Five => (x & 31, x >> 5 | ((p[128 + at] >> (2 * j)) & 3) << 3),
                Bits::Six => (
                    x & 63,
                    x >> 6 | ((p[128 + 32 * (j / 2) + at] >> (4 * (j % 2))) & 15) << 2,
                ),
            };
        }
    }
}
