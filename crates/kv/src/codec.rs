//! Wire codecs for one layer's K/V over a token range. Layout: K then V; within each, KV head
//! by head; within a head, token rows of `head_dim` values.
//!
//! - f16: the engine's own values, lossless;
//! - int8: per (token, head) row, an f16 scale (max |x| / 127) and `head_dim` signed bytes;
//! - int4: per group of 32 values, an f16 scale ((max - min) / 15), an f16 minimum and 16 bytes
//!   of nibbles (x - min) / scale: asymmetric, since K rows are often far from zero-centred.
//! - int8ch / int4ch (KIVI's split): keys per channel over the chunk's tokens (a few channels of
//!   K are much larger than the rest, so a per-row scale spends its levels on them), values per
//!   token. A key head is its first row in f16, then groups of up to 64 tokens, each `head_dim`
//!   pairs (f16 scale, f16 minimum) and the group's codes (bytes, or nibbles two per byte) in
//!   row order. Values: int8ch as int8 rows; int4ch as int4 rows with one group per 64 values.
//!
//! Any of them may be zstd-compressed afterwards.

use half::f16;

use crate::{KvError, Result};

/// Most tokens one chunk may carry (senders use 256): a bound on what one chunk can make a
/// receiver decode, whatever it claims.
pub const MAX_CHUNK_TOKENS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Codec {
    F16,
    Int8,
    Int4,
    Int8Ch,
    Int4Ch,
}

/// Values per int4 group in the row codec, and in int4ch's value rows.
const GROUP: usize = 32;
const GROUP_CH: usize = 64;
/// Tokens per key group in the per-channel codecs (one scale and minimum per channel each).
const KEY_GROUP: usize = 64;

impl Codec {
    /// Every codec, in the order an edge would prefer them for fidelity.
    pub const ALL: [Codec; 5] = [
        Codec::F16,
        Codec::Int8Ch,
        Codec::Int8,
        Codec::Int4Ch,
        Codec::Int4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Codec::F16 => "f16",
            Codec::Int8 => "int8",
            Codec::Int4 => "int4",
            Codec::Int8Ch => "int8ch",
            Codec::Int4Ch => "int4ch",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The codec's byte in the stored-prefix format (never reused).
    pub fn id(self) -> u8 {
        match self {
            Codec::F16 => 0,
            Codec::Int8 => 1,
            Codec::Int4 => 2,
            Codec::Int8Ch => 3,
            Codec::Int4Ch => 4,
        }
    }

    pub fn from_id(id: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.id() == id)
    }

    /// The names `parse` accepts, for error messages.
    pub fn names() -> String {
        Self::ALL.map(|c| c.name()).join(", ")
    }

    /// Encoded bytes of one row of `head_dim` values (a value row for the channel codecs).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            Codec::F16 => 2 * head_dim,
            Codec::Int8 | Codec::Int8Ch => 2 + head_dim,
            Codec::Int4 => head_dim.div_ceil(GROUP) * (4 + GROUP / 2),
            Codec::Int4Ch => head_dim.div_ceil(GROUP_CH) * (4 + GROUP_CH / 2),
        }
    }

    /// Encoded bytes of one head of `n` tokens: keys (`key`) or values.
    pub fn head_bytes(self, head_dim: usize, n: usize, key: bool) -> usize {
        match (self, key) {
            (_, _) if n == 0 => 0,
            (Codec::Int8Ch, true) => channel_head_bytes(head_dim, n, 8),
            (Codec::Int4Ch, true) => channel_head_bytes(head_dim, n, 4),
            _ => n * self.row_bytes(head_dim),
        }
    }

    /// Bytes of a chunk of `n` tokens over `n_kv_head` heads, before zstd.
    pub fn chunk_bytes(self, n_kv_head: usize, head_dim: usize, n: usize) -> usize {
        n_kv_head * (self.head_bytes(head_dim, n, true) + self.head_bytes(head_dim, n, false))
    }

    fn encode_row(self, row: &[f16], out: &mut Vec<u8>) {
        match self {
            Codec::Int8Ch => Codec::Int8.encode_row(row, out),
            Codec::Int4Ch => int4_groups(row, GROUP_CH, out),
            Codec::F16 => row.iter().for_each(|x| out.extend(x.to_le_bytes())),
            Codec::Int8 => {
                let amax = row.iter().fold(0f32, |a, x| a.max(x.to_f32().abs()));
                let d = f16::from_f32(amax / 127.0);
                let id = if d.to_f32() > 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                out.extend(d.to_le_bytes());
                out.extend(
                    row.iter()
                        .map(|x| (x.to_f32() * id).round().clamp(-127.0, 127.0) as i8 as u8),
                );
            }
            Codec::Int4 => int4_groups(row, GROUP, out),
        }
    }

    fn decode_row(self, b: &[u8], head_dim: usize, out: &mut Vec<f16>) {
        match self {
            Codec::Int8Ch => Codec::Int8.decode_row(b, head_dim, out),
            Codec::Int4Ch => int4_ungroup(b, GROUP_CH, head_dim, out),
            Codec::F16 => out.extend(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]))),
            Codec::Int8 => {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..].iter().map(|&q| f16::from_f32(q as i8 as f32 * d)));
            }
            Codec::Int4 => int4_ungroup(b, GROUP, head_dim, out),
        }
    }

    /// Bits per key code for the per-channel key codecs.
    fn channel_bits(self) -> Option<u32> {
        match self {
            Codec::Int8Ch => Some(8),
            Codec::Int4Ch => Some(4),
            _ => None,
        }
    }

    fn encode_head(self, head: &[f16], head_dim: usize, key: bool, out: &mut Vec<u8>) {
        match self.channel_bits() {
            Some(bits) if key && !head.is_empty() => encode_channels(head, head_dim, bits, out),
            _ => head
                .chunks_exact(head_dim)
                .for_each(|row| self.encode_row(row, out)),
        }
    }

    fn decode_head(self, b: &[u8], head_dim: usize, n: usize, key: bool) -> Vec<f16> {
        let mut h = Vec::with_capacity(n * head_dim);
        match self.channel_bits() {
            Some(bits) if key && n > 0 => decode_channels(b, head_dim, n, bits, &mut h),
            _ => {
                for row in b.chunks_exact(self.row_bytes(head_dim)) {
                    self.decode_row(row, head_dim, &mut h);
                }
            }
        }
        h
    }
}

/// Asymmetric `levels`-step quantizer of `[lo, hi]` with f16 scale and minimum.
fn range(lo: f32, hi: f32, levels: f32) -> (f16, f16, f32) {
    let d = f16::from_f32((hi - lo) / levels);
    let m = f16::from_f32(lo);
    let id = if d.to_f32() > 0.0 {
        1.0 / d.to_f32()
    } else {
        0.0
    };
    (d, m, id)
}

fn min_max(xs: impl Iterator<Item = f32>) -> (f32, f32) {
    xs.fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    })
}

/// Rows in groups of `group` values: f16 scale, f16 minimum, nibbles.
fn int4_groups(row: &[f16], group: usize, out: &mut Vec<u8>) {
    for g in row.chunks(group) {
        let (lo, hi) = min_max(g.iter().map(|x| x.to_f32()));
        let (d, m, id) = range(lo, hi, 15.0);
        out.extend(d.to_le_bytes());
        out.extend(m.to_le_bytes());
        let q = |i: usize| -> u8 {
            g.get(i).map_or(0, |x| {
                ((x.to_f32() - m.to_f32()) * id).round().clamp(0.0, 15.0) as u8
            })
        };
        out.extend((0..group / 2).map(|j| q(2 * j) | (q(2 * j + 1) << 4)));
    }
}

fn int4_ungroup(b: &[u8], group: usize, head_dim: usize, out: &mut Vec<f16>) {
    let mut left = head_dim;
    for g in b.chunks_exact(4 + group / 2) {
        let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
        let m = f16::from_le_bytes([g[2], g[3]]).to_f32();
        let vals = g[4..]
            .iter()
            .flat_map(|&x| [x & 0xF, x >> 4])
            .map(|q| f16::from_f32(q as f32 * d + m));
        let n = left.min(group);
        out.extend(vals.take(n));
        left -= n;
    }
}

/// One key head (token-major rows): its first row as f16 (the stream's first token is an
/// attention sink whose keys dwarf the rest; in other chunks one f16 row costs little), the
/// other rows in groups of `KEY_GROUP` tokens, each quantized per channel.
fn encode_channels(head: &[f16], head_dim: usize, bits: u32, out: &mut Vec<u8>) {
    let (first, rest) = head.split_at(head_dim);
    first.iter().for_each(|x| out.extend(x.to_le_bytes()));
    for g in rest.chunks(KEY_GROUP * head_dim) {
        encode_group(g, head_dim, bits, out);
    }
}

/// Bytes of a key head of `n >= 1` tokens in the per-channel codecs.
fn channel_head_bytes(head_dim: usize, n: usize, bits: u32) -> usize {
    let group = |rows: usize| 4 * head_dim + (rows * head_dim * bits as usize).div_ceil(8);
    let (full, last) = ((n - 1) / KEY_GROUP, (n - 1) % KEY_GROUP);
    2 * head_dim + full * group(KEY_GROUP) + if last > 0 { group(last) } else { 0 }
}

fn encode_group(rows: &[f16], head_dim: usize, bits: u32, out: &mut Vec<u8>) {
    let levels = ((1u32 << bits) - 1) as f32;
    let params: Vec<(f16, f16, f32)> = (0..head_dim)
        .map(|c| {
            let (lo, hi) = min_max(rows.iter().skip(c).step_by(head_dim).map(|x| x.to_f32()));
            range(lo, hi, levels)
        })
        .collect();
    for (d, m, _) in &params {
        out.extend(d.to_le_bytes());
        out.extend(m.to_le_bytes());
    }
    let code = |i: usize, x: &f16| -> u8 {
        let (_, m, id) = params[i % head_dim];
        ((x.to_f32() - m.to_f32()) * id).round().clamp(0.0, levels) as u8
    };
    if bits == 8 {
        out.extend(rows.iter().enumerate().map(|(i, x)| code(i, x)));
    } else {
        for (j, pair) in rows.chunks(2).enumerate() {
            let lo = code(2 * j, &pair[0]);
            let hi = pair.get(1).map_or(0, |x| code(2 * j + 1, x));
            out.push(lo | (hi << 4));
        }
    }
}

fn decode_channels(b: &[u8], head_dim: usize, n: usize, bits: u32, out: &mut Vec<f16>) {
    let (first, mut b) = b.split_at(2 * head_dim);
    out.extend(
        first
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]])),
    );
    let mut left = n - 1;
    while left > 0 {
        let rows = left.min(KEY_GROUP);
        let len = 4 * head_dim + (rows * head_dim * bits as usize).div_ceil(8);
        let (g, rest) = b.split_at(len);
        decode_group(g, head_dim, rows, bits, out);
        b = rest;
        left -= rows;
    }
}

fn decode_group(b: &[u8], head_dim: usize, rows: usize, bits: u32, out: &mut Vec<f16>) {
    let (params, codes) = b.split_at(4 * head_dim);
    let dm: Vec<(f32, f32)> = params
        .chunks_exact(4)
        .map(|p| {
            (
                f16::from_le_bytes([p[0], p[1]]).to_f32(),
                f16::from_le_bytes([p[2], p[3]]).to_f32(),
            )
        })
        .collect();
    let value = |i: usize, q: u8| {
        let (d, m) = dm[i % head_dim];
        f16::from_f32(q as f32 * d + m)
    };
    if bits == 8 {
        out.extend(codes.iter().enumerate().map(|(i, &q)| value(i, q)));
    } else {
        let nibbles = codes.iter().flat_map(|&x| [x & 0xF, x >> 4]);
        out.extend(
            nibbles
                .take(rows * head_dim)
                .enumerate()
                .map(|(i, q)| value(i, q)),
        );
    }
}

/// Encode K and V heads (token-major rows per head) of `n_tokens` tokens.
pub fn encode(
    codec: Codec,
    zstd_level: Option<i32>,
    k: &[&[f16]],
    v: &[&[f16]],
    head_dim: usize,
) -> Result<Vec<u8>> {
    let n = k.first().map_or(0, |h| h.len() / head_dim);
    let mut out = Vec::with_capacity(codec.chunk_bytes(k.len(), head_dim, n));
    for (i, head) in k.iter().chain(v).enumerate() {
        codec.encode_head(head, head_dim, i < k.len(), &mut out);
    }
    match zstd_level {
        Some(level) => zstd::bulk::compress(&out, level).map_err(|e| KvError::Codec(e.to_string())),
        None => Ok(out),
    }
}

/// Decode into (K heads, V heads), each `n_tokens * head_dim` values.
#[allow(clippy::type_complexity)]
pub fn decode(
    codec: Codec,
    compressed: bool,
    bytes: &[u8],
    n_kv_head: usize,
    head_dim: usize,
    n_tokens: usize,
) -> Result<(Vec<Vec<f16>>, Vec<Vec<f16>>)> {
    // Bounded before anything is allocated: zstd below reserves `expect` bytes.
    if n_tokens > MAX_CHUNK_TOKENS || n_kv_head > 1024 || head_dim > 4096 {
        return Err(KvError::Shape(format!(
            "a chunk of {n_tokens} tokens x {n_kv_head} heads x {head_dim} is past the bounds"
        )));
    }
    let expect = codec.chunk_bytes(n_kv_head, head_dim, n_tokens);
    let raw;
    let bytes = if compressed {
        raw = zstd::bulk::decompress(bytes, expect)
            .map_err(|e| KvError::Codec(format!("zstd: {e}")))?;
        &raw[..]
    } else {
        bytes
    };
    if bytes.len() != expect {
        return Err(KvError::Shape(format!(
            "{} payload bytes, expected {expect} for {n_tokens} tokens x {n_kv_head} heads x {head_dim} ({})",
            bytes.len(),
            codec.name()
        )));
    }
    let (kb, vb) = (
        codec.head_bytes(head_dim, n_tokens, true),
        codec.head_bytes(head_dim, n_tokens, false),
    );
    let (kpart, vpart) = bytes.split_at(n_kv_head * kb);
    let heads = |part: &[u8], hb: usize, key: bool| -> Vec<Vec<f16>> {
        (0..n_kv_head)
            .map(|h| codec.decode_head(&part[h * hb..(h + 1) * hb], head_dim, n_tokens, key))
            .collect()
    };
    Ok((heads(kpart, kb, true), heads(vpart, vb, false)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads(n_head: usize, n_tok: usize, d: usize, seed: u32) -> Vec<Vec<f16>> {
        (0..n_head)
            .map(|h| {
                (0..n_tok * d)
                    .map(|i| {
                        f16::from_f32(
                            (((i as u32 * 2654435761) ^ seed ^ h as u32) % 2000) as f32 / 500.0
                                - 2.0,
                        )
                    })
                    .collect()
            })
            .collect()
    }

    fn roundtrip(codec: Codec, z: Option<i32>) -> f32 {
        let (nh, nt, d) = (2, 7, 64);
        let (k, v) = (heads(nh, nt, d, 1), heads(nh, nt, d, 2));
        let kr: Vec<&[f16]> = k.iter().map(|h| &h[..]).collect();
        let vr: Vec<&[f16]> = v.iter().map(|h| &h[..]).collect();
        let bytes = encode(codec, z, &kr, &vr, d).unwrap();
        if z.is_none() {
            assert_eq!(bytes.len(), codec.chunk_bytes(nh, d, nt));
        }
        let (k2, v2) = decode(codec, z.is_some(), &bytes, nh, d, nt).unwrap();
        k.iter()
            .chain(&v)
            .flatten()
            .zip(k2.iter().chain(&v2).flatten())
            .map(|(a, b)| (a.to_f32() - b.to_f32()).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn f16_is_lossless_and_quantized_codecs_are_bounded() {
        assert_eq!(roundtrip(Codec::F16, None), 0.0);
        assert_eq!(roundtrip(Codec::F16, Some(3)), 0.0);
        assert!(roundtrip(Codec::Int8, None) <= 2.0 / 127.0 * 0.51 + 1e-3);
        assert!(roundtrip(Codec::Int4, Some(1)) <= 4.0 / 15.0 * 0.51 + 1e-2);
        assert!(roundtrip(Codec::Int8Ch, None) <= 4.0 / 255.0 * 0.51 + 2e-3);
        assert!(roundtrip(Codec::Int4Ch, Some(1)) <= 4.0 / 15.0 * 0.51 + 1e-2);
    }

    /// Keys with one channel 100x the others: a per-row scale loses the small channels, the
    /// per-channel codecs keep them.
    #[test]
    fn channel_codecs_keep_small_channels_next_to_an_outlier() {
        let (nt, d) = (40, 64);
        let k: Vec<f16> = (0..nt * d)
            .map(|i| {
                let (t, c) = (i / d, i % d);
                let x = ((t * 7 + c * 13) % 17) as f32 / 17.0 - 0.5;
                f16::from_f32(if c == 5 { 50.0 + x } else { x * 0.5 })
            })
            .collect();
        let v = k.clone();
        let err = |codec: Codec| {
            let bytes = encode(codec, None, &[&k[..]], &[&v[..]], d).unwrap();
            let (k2, _) = decode(codec, false, &bytes, 1, d, nt).unwrap();
            k.iter()
                .zip(&k2[0])
                .enumerate()
                .filter(|(i, _)| i % d != 5)
                .map(|(_, (a, b))| (a.to_f32() - b.to_f32()).abs())
                .fold(0.0, f32::max)
        };
        assert!(err(Codec::Int8) > 0.1, "per-row int8 is coarse here");
        assert!(err(Codec::Int8Ch) < 0.003, "{}", err(Codec::Int8Ch));
        assert!(err(Codec::Int4Ch) < 0.05, "{}", err(Codec::Int4Ch));
    }

    #[test]
    fn names_round_trip_and_sizes_shrink() {
        for c in Codec::ALL {
            assert_eq!(Codec::parse(c.name()), Some(c));
        }
        let f16 = Codec::F16.chunk_bytes(2, 64, 256) as f64;
        assert!(f16 / Codec::Int8Ch.chunk_bytes(2, 64, 256) as f64 > 1.9);
        assert!(f16 / Codec::Int4Ch.chunk_bytes(2, 64, 256) as f64 > 3.5);
        assert_eq!(Codec::Int4Ch.chunk_bytes(2, 64, 0), 0);
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        for codec in Codec::ALL {
            assert!(decode(codec, false, &[1, 2, 3], 2, 64, 1).is_err());
            assert!(decode(codec, true, &[1, 2, 3], 2, 64, 1).is_err());
        }
    }
}
