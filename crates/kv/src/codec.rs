//! Wire codecs for one layer's K/V over a token range. Layout: K then V; within each, KV head
//! by head; within a head, token rows of `head_dim` values.
//!
//! - f16: the engine's own values, lossless;
//! - int8: per (token, head) row, an f16 scale (max |x| / 127) and `head_dim` signed bytes;
//! - int4: per group of 32 values, an f16 scale ((max - min) / 15), an f16 minimum and 16 bytes
//!   of nibbles (x - min) / scale: asymmetric, since K rows are often far from zero-centred.
//!
//! Any of them may be zstd-compressed afterwards.

use half::f16;

use crate::{KvError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Codec {
    F16,
    Int8,
    Int4,
}

const GROUP: usize = 32;

impl Codec {
    pub fn name(self) -> &'static str {
        match self {
            Codec::F16 => "f16",
            Codec::Int8 => "int8",
            Codec::Int4 => "int4",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f16" => Some(Codec::F16),
            "int8" => Some(Codec::Int8),
            "int4" => Some(Codec::Int4),
            _ => None,
        }
    }

    /// Encoded bytes of one row of `head_dim` values.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            Codec::F16 => 2 * head_dim,
            Codec::Int8 => 2 + head_dim,
            Codec::Int4 => head_dim.div_ceil(GROUP) * (4 + GROUP / 2),
        }
    }

    fn encode_row(self, row: &[f16], out: &mut Vec<u8>) {
        match self {
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
            Codec::Int4 => {
                for g in row.chunks(GROUP) {
                    let (lo, hi) = g
                        .iter()
                        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), x| {
                            (a.min(x.to_f32()), b.max(x.to_f32()))
                        });
                    let d = f16::from_f32((hi - lo) / 15.0);
                    let m = f16::from_f32(lo);
                    let id = if d.to_f32() > 0.0 {
                        1.0 / d.to_f32()
                    } else {
                        0.0
                    };
                    out.extend(d.to_le_bytes());
                    out.extend(m.to_le_bytes());
                    let q = |i: usize| -> u8 {
                        g.get(i).map_or(0, |x| {
                            ((x.to_f32() - m.to_f32()) * id).round().clamp(0.0, 15.0) as u8
                        })
                    };
                    out.extend((0..GROUP / 2).map(|j| q(2 * j) | (q(2 * j + 1) << 4)));
                }
            }
        }
    }

    fn decode_row(self, b: &[u8], head_dim: usize, out: &mut Vec<f16>) {
        match self {
            Codec::F16 => out.extend(b.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]))),
            Codec::Int8 => {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..].iter().map(|&q| f16::from_f32(q as i8 as f32 * d)));
            }
            Codec::Int4 => {
                let mut left = head_dim;
                for g in b.chunks_exact(4 + GROUP / 2) {
                    let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
                    let m = f16::from_le_bytes([g[2], g[3]]).to_f32();
                    let vals = g[4..]
                        .iter()
                        .flat_map(|&x| [x & 0xF, x >> 4])
                        .map(|q| f16::from_f32(q as f32 * d + m));
                    let n = left.min(GROUP);
                    out.extend(vals.take(n));
                    left -= n;
                }
            }
        }
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
    let n_rows: usize = k.iter().chain(v).map(|h| h.len() / head_dim).sum();
    let mut out = Vec::with_capacity(n_rows * codec.row_bytes(head_dim));
    for head in k.iter().chain(v) {
        for row in head.chunks_exact(head_dim) {
            codec.encode_row(row, &mut out);
        }
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
    let rb = codec.row_bytes(head_dim);
    let expect = 2 * n_kv_head * n_tokens * rb;
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
    let mut heads = bytes.chunks_exact(n_tokens.max(1) * rb).map(|hb| {
        let mut h = Vec::with_capacity(n_tokens * head_dim);
        for row in hb.chunks_exact(rb) {
            codec.decode_row(row, head_dim, &mut h);
        }
        h
    });
    let k: Vec<_> = (&mut heads).take(n_kv_head).collect();
    let v: Vec<_> = heads.take(n_kv_head).collect();
    if n_tokens == 0 {
        return Ok((vec![Vec::new(); n_kv_head], vec![Vec::new(); n_kv_head]));
    }
    Ok((k, v))
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
            assert_eq!(bytes.len(), 2 * nh * nt * codec.row_bytes(d));
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
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        for codec in [Codec::F16, Codec::Int8, Codec::Int4] {
            assert!(decode(codec, false, &[1, 2, 3], 2, 64, 1).is_err());
            assert!(decode(codec, true, &[1, 2, 3], 2, 64, 1).is_err());
        }
    }
}
