//! GGUF block layouts (ggml's q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K,
//! iq4_nl, iq4_xs) and their unpacking to
//! blocks of 32 signed bytes with a float scale (and min), the form the dot kernel reads.

use half::f16;

use super::{Unpacked, QK};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Format {
    Q4_0 = 0,
    Q4_1 = 1,
    Q5_0 = 2,
    Q5_1 = 7,
    Q8_0 = 3,
    Q2K = 11,
    Q3K = 10,
    Q4K = 4,
    Q5K = 6,
    Q6K = 5,
    IQ4NL = 8,
    IQ4XS = 9,
}

impl Format {
    /// The format as the tiles' const generic parameter (`code`).
    pub(crate) const fn code(self) -> u8 {
        self as u8
    }

    /// The format of a tile's `code`.
    pub(crate) const fn of_code(c: u8) -> Format {
        match c {
            code::Q4_0 => Format::Q4_0,
            code::Q4_1 => Format::Q4_1,
            code::Q5_0 => Format::Q5_0,
            code::Q8_0 => Format::Q8_0,
            code::Q4K => Format::Q4K,
            code::Q6K => Format::Q6K,
            code::Q5K => Format::Q5K,
            code::Q5_1 => Format::Q5_1,
            code::IQ4NL => Format::IQ4NL,
            code::IQ4XS => Format::IQ4XS,
            code::Q3K => Format::Q3K,
            code::Q2K => Format::Q2K,
            _ => panic!("no format has this code"),
        }
    }
}

/// The formats' codes, to match on in the tiles.
pub(crate) mod code {
    use super::Format;
    pub(crate) const Q4_0: u8 = Format::Q4_0.code();
    pub(crate) const Q4_1: u8 = Format::Q4_1.code();
    pub(crate) const Q5_0: u8 = Format::Q5_0.code();
    pub(crate) const Q8_0: u8 = Format::Q8_0.code();
    pub(crate) const Q4K: u8 = Format::Q4K.code();
    pub(crate) const Q6K: u8 = Format::Q6K.code();
    pub(crate) const Q5K: u8 = Format::Q5K.code();
    pub(crate) const Q5_1: u8 = Format::Q5_1.code();
    pub(crate) const IQ4NL: u8 = Format::IQ4NL.code();
    pub(crate) const IQ4XS: u8 = Format::IQ4XS.code();
    pub(crate) const Q3K: u8 = Format::Q3K.code();
    pub(crate) const Q2K: u8 = Format::Q2K.code();
}

/// The 16 values of the non-linear 4-bit formats (ggml's `kvalues_iq4nl`).
pub(crate) const IQ4: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The f16 at byte `i` of `b`, as f32.
#[inline(always)]
pub(super) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// How a 32-block's values lie in a repacked plane (`repack.rs`): the one place that says it
/// per format, so what reads or writes planes matches on this, not on formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plane {
    /// q8_0's signed bytes, eight 32-byte chunks.
    Bytes,
    /// q2_K's 2-bit values, two chunks.
    TwoBit,
    /// Values split in a low nibble and a high part: four chunks of two values a byte, and
    /// the high parts' top bits after them.
    Split(Bits),
}

/// Bits of a split plane's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bits {
    /// 4 bits: nothing after the four chunks.
    Four,
    /// 5 bits: one chunk of top bits (q5_0, q5_1, q5_K).
    Five,
    /// 6 bits: two chunks of top bits (q6_K).
    Six,
}

impl Format {
    pub(crate) const fn plane(self) -> Plane {
        match self {
            Format::Q8_0 => Plane::Bytes,
            Format::Q2K => Plane::TwoBit,
            Format::Q5_0 | Format::Q5_1 | Format::Q5K => Plane::Split(Bits::Five),
            Format::Q6K => Plane::Split(Bits::Six),
            Format::Q4_0
            | Format::Q4_1
            | Format::Q3K
            | Format::Q4K
            | Format::IQ4NL
            | Format::IQ4XS => Plane::Split(Bits::Four),
        }
    }

    /// What a stored value stands for above zero (`d * (q - zero)`): the 32-block formats'
    /// unsigned offsets; the others store signed values or a min.
    pub(crate) const fn zero_point(self) -> i32 {
        match self {
            Format::Q4_0 => 8,
            Format::Q5_0 => 16,
            Format::Q4_1
            | Format::Q5_1
            | Format::Q8_0
            | Format::Q2K
            | Format::Q3K
            | Format::Q4K
            | Format::Q5K
            | Format::Q6K
            | Format::IQ4NL
            | Format::IQ4XS => 0,
        }
    }

    /// Values per stored block (32, or 256 for the K formats).
    pub fn block_values(self) -> usize {
        match self {
            Format::Q2K | Format::Q3K | Format::Q4K | Format::Q5K | Format::Q6K | Format::IQ4XS => {
                256
            }
            Format::Q4_0
            | Format::Q4_1
            | Format::Q5_0
            | Format::Q5_1
            | Format::Q8_0
            | Format::IQ4NL => QK,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 2 + QK / 2,
            Format::Q4_1 => 4 + QK / 2,
            Format::Q5_0 => 2 + 4 + QK / 2,
            Format::Q5_1 => 4 + 4 + QK / 2,
            Format::Q8_0 => 2 + QK,
            Format::Q2K => 16 + 64 + 2 + 2,
            Format::Q3K => 32 + 64 + 12 + 2,
            Format::Q4K => 4 + 12 + 128,
            Format::Q5K => 4 + 12 + 32 + 128,
            Format::Q6K => 128 + 64 + 16 + 2,
            Format::IQ4NL => 2 + QK / 2,
            Format::IQ4XS => 2 + 2 + 4 + 128,
        }
    }

    /// Formats whose values are `d * q + m` rather than `d * q`.
    pub fn has_min(self) -> bool {
        matches!(
            self,
            Format::Q4_1 | Format::Q5_1 | Format::Q2K | Format::Q4K | Format::Q5K
        )
    }

    /// Values per activation scale: the K formats' super blocks are summed in integers under
    /// one activation scale (as ggml's q8_K), which leaves one float term per 256 values.
    pub fn act_block(self) -> usize {
        self.block_values()
    }

    pub fn is_k(self) -> bool {
        self.block_values() != QK
    }

    /// Unpacking of GGUF rows (the reference dot and `dequantize`; the tiles read the same
    /// values from the repacked planes).
    #[inline(always)]
    pub(super) fn unpack(self, row: &[u8], out: &mut Unpacked) {
        let bb = self.block_bytes();
        let per = self.block_values() / QK;
        for (sb, blk) in row.chunks_exact(bb).enumerate() {
            let b0 = sb * per;
            let q = &mut out.q[b0 * QK..(b0 + per) * QK];
            match self {
                Format::Q4_0 => {
                    out.d[b0] = f16_at(blk, 0);
                    nibbles(&blk[2..18], -8, q)
                }
                Format::Q4_1 => {
                    out.d[b0] = f16_at(blk, 0);
                    out.m[b0] = f16_at(blk, 2);
                    nibbles(&blk[4..20], 0, q)
                }
                Format::Q5_0 => {
                    out.d[b0] = f16_at(blk, 0);
                    let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                    nibbles(&blk[6..22], 0, q);
                    for (j, v) in q.iter_mut().enumerate() {
                        *v = (*v | (((qh >> j) & 1) << 4) as i8) - 16;
                    }
                }
                Format::Q5_1 => {
                    out.d[b0] = f16_at(blk, 0);
                    out.m[b0] = f16_at(blk, 2);
                    let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
                    nibbles(&blk[8..24], 0, q);
                    for (j, v) in q.iter_mut().enumerate() {
                        *v |= (((qh >> j) & 1) << 4) as i8;
                    }
                }
                Format::Q8_0 => {
                    out.d[b0] = f16_at(blk, 0);
                    for (v, &x) in q.iter_mut().zip(&blk[2..34]) {
                        *v = x as i8;
                    }
                }
                Format::Q4K | Format::Q5K => {
                    out.d[b0] = f16_at(blk, 0);
                    out.m[b0] = -f16_at(blk, 2);
                    let scales = &blk[4..16];
                    for j in 0..8 {
                        let (sc, m) = q4k_scale_min(scales, j);
                        out.sc[2 * (b0 + j)] = sc as i32;
                        out.sc[2 * (b0 + j) + 1] = sc as i32;
                        out.mi[2 * (b0 + j)] = m as i32;
                        out.mi[2 * (b0 + j) + 1] = m as i32;
                    }
                    let mut v = [0u8; 256];
                    k_values(self, blk, &mut v);
                    for (q, v) in q.iter_mut().zip(v) {
                        *q = v as i8;
                    }
                }
                Format::Q2K => {
                    out.d[b0] = f16_at(blk, 80);
                    out.m[b0] = -f16_at(blk, 82);
                    // A byte per half block: the scale in the low nibble, the min above.
                    for (h, &s) in blk[..16].iter().enumerate() {
                        out.sc[2 * b0 + h] = (s & 15) as i32;
                        out.mi[2 * b0 + h] = (s >> 4) as i32;
                    }
                    let mut v = [0u8; 256];
                    q2k_values(blk, &mut v);
                    for (q, v) in q.iter_mut().zip(v) {
                        *q = v as i8;
                    }
                }
                Format::Q3K => {
                    out.d[b0] = f16_at(blk, 108);
                    out.m[b0] = 0.0;
                    for j in 0..8 {
                        for h in 0..2 {
                            out.mi[2 * (b0 + j) + h] = 0;
                            out.sc[2 * (b0 + j) + h] = q3k_scale(blk, 2 * j + h) as i32 - 32;
                        }
                    }
                    let mut v = [0u8; 256];
                    q3k_values(blk, &mut v);
                    for (q, v) in q.iter_mut().zip(v) {
                        *q = v as i8 - 4;
                    }
                }
                Format::IQ4NL => {
                    out.d[b0] = f16_at(blk, 0);
                    nibbles(&blk[2..18], 0, q);
                    q.iter_mut().for_each(|v| *v = IQ4[*v as usize]);
                }
                Format::IQ4XS => {
                    out.d[b0] = f16_at(blk, 0);
                    out.m[b0] = 0.0;
                    for j in 0..8 {
                        let sc = iq4xs_scale(blk, j) as i32 - 32;
                        out.sc[2 * (b0 + j)] = sc;
                        out.sc[2 * (b0 + j) + 1] = sc;
                        out.mi[2 * (b0 + j)] = 0;
                        out.mi[2 * (b0 + j) + 1] = 0;
                        nibbles(
                            &blk[8 + 16 * j..24 + 16 * j],
                            0,
                            &mut q[32 * j..32 * (j + 1)],
                        );
                    }
                    q.iter_mut().for_each(|v| *v = IQ4[*v as usize]);
                }
                Format::Q6K => {
                    let (ql, qh) = (&blk[0..128], &blk[128..192]);
                    let sc = &blk[192..208];
                    out.d[b0] = f16_at(blk, 208);
                    out.m[b0] = 0.0;
                    for j in 0..8 {
                        out.mi[2 * (b0 + j)] = 0;
                        out.mi[2 * (b0 + j) + 1] = 0;
                        out.sc[2 * (b0 + j)] = sc[2 * j] as i8 as i32;
                        out.sc[2 * (b0 + j) + 1] = sc[2 * j + 1] as i8 as i32;
                    }
                    for half in 0..2 {
                        let (ql, qh) = (&ql[half * 64..], &qh[half * 32..]);
                        let y = &mut q[half * 128..];
                        for l in 0..32 {
                            y[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                            y[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                            y[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                            y[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                        }
                    }
                }
            }
        }
    }

    /// Plain f32 values of one row (embedding lookup, tests).
    pub fn dequantize(self, row: &[u8], k: usize) -> Vec<f32> {
        let mut un = Unpacked::new(k);
        self.unpack(row, &mut un);
        let per = self.block_values() / QK;
        un.q[..k]
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let b = i / QK;
                if self.is_k() {
                    let s = b - b % per;
                    let h = 2 * b + (i % QK) / 16;
                    (un.d[s] * un.sc[h] as f32) * q as f32 + un.m[s] * un.mi[h] as f32
                } else {
                    un.d[b] * q as f32 + un.m[b]
                }
            })
            .collect()
    }
}

/// The 6-bit scale (32 above the signed one) of half block `i` (16 values) of a q3_K block:
/// 4 bits in the first 8 of its 12 scale bytes, 2 in the last 4.
#[inline(always)]
pub(crate) fn q3k_scale(blk: &[u8], i: usize) -> u8 {
    let s = &blk[96..108];
    let low = if i < 8 { s[i] & 15 } else { s[i - 8] >> 4 };
    low | ((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4
}

/// The values (0..4) of a q2_K block: value `128n + 32j + l` at bits `2j` of `qs[32n + l]`.
#[inline(always)]
pub(crate) fn q2k_values(blk: &[u8], v: &mut [u8]) {
    let qs = &blk[16..80];
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                v[128 * n + 32 * j + l] = (qs[32 * n + l] >> (2 * j)) & 3;
            }
        }
    }
}

/// The unsigned values (0..8, 4 above the signed ones) of a q3_K block: value
/// `128n + 32j + l` has its low 2 bits at bits `2j` of `qs[32n + l]` and its third bit at bit
/// `4n + j` of `hmask[l]`.
#[inline(always)]
pub(crate) fn q3k_values(blk: &[u8], v: &mut [u8]) {
    let (hm, qs) = (&blk[..32], &blk[32..96]);
    for n in 0..2 {
        for j in 0..4 {
            for l in 0..32 {
                let low = (qs[32 * n + l] >> (2 * j)) & 3;
                let high = (hm[l] >> (4 * n + j)) & 1;
                v[128 * n + 32 * j + l] = low | high << 2;
            }
        }
    }
}

/// The 6-bit scale (32 above the signed one) of sub-block `j` of an iq4_xs block: 4 bits in
/// `scales_l`, 2 in `scales_h`.
#[inline(always)]
pub(crate) fn iq4xs_scale(blk: &[u8], j: usize) -> u8 {
    let high = u16::from_le_bytes([blk[2], blk[3]]);
    ((blk[4 + j / 2] >> (4 * (j % 2))) & 15) | (((high >> (2 * j)) & 3) as u8) << 4
}

/// ggml's packed 6-bit scale and min of sub-block `j` of a q4_K block.
#[inline(always)]
pub(crate) fn q4k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The unsigned values of a q4_K or q5_K block: 32 bytes of nibbles per 64 values, low
/// nibbles first; q5_K's fifth bits in `qh`, value `64c + l` at bit `2c` of byte `l` and
/// value `64c + 32 + l` at bit `2c + 1`.
#[inline(always)]
pub(super) fn k_values(f: Format, blk: &[u8], v: &mut [u8]) {
    let (qs, qh) = match f {
        Format::Q5K => (&blk[48..176], &blk[16..48]),
        Format::Q4K => (&blk[16..144], &[0u8; 32][..]),
        other => unreachable!("{other:?} is neither q4_K nor q5_K"),
    };
    for (c, qs) in qs.chunks_exact(32).enumerate() {
        for (l, &x) in qs.iter().enumerate() {
            let (h0, h1) = ((qh[l] >> (2 * c)) & 1, (qh[l] >> (2 * c + 1)) & 1);
            v[c * 64 + l] = (x & 0x0F) | h0 << 4;
            v[c * 64 + 32 + l] = (x >> 4) | h1 << 4;
        }
    }
}

/// ggml nibble order: byte j holds value j (low nibble) and value j + 16 (high nibble).
#[inline(always)]
fn nibbles(qs: &[u8], offset: i8, out: &mut [i8]) {
    let (lo, hi) = out.split_at_mut(QK / 2);
    for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = (x & 0x0F) as i8 + offset;
        *h = (x >> 4) as i8 + offset;
    }
}
