//! Vectors (norms, biases) in any GGUF format the engine reads, expanded to f32 at load; the
//! expansion is also the reference the quantized formats' tests hold the kernels to.

use half::{bf16, f16};

use crate::gguf::Dtype;
use crate::kernels::IQ4;
use crate::{EngineError, Result};

fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Whether rows of `dtype` can be expanded here.
pub fn runs(dtype: Dtype) -> bool {
    matches!(
        dtype,
        Dtype::F32
            | Dtype::F16
            | Dtype::BF16
            | Dtype::Q4_0
            | Dtype::Q4_1
            | Dtype::Q5_0
            | Dtype::Q5_1
            | Dtype::Q8_0
            | Dtype::Q2K
            | Dtype::Q3K
            | Dtype::Q4K
            | Dtype::Q5K
            | Dtype::Q6K
            | Dtype::IQ4NL
            | Dtype::IQ4XS
    )
}

/// One row of `out.len()` values from its bytes (whole blocks of `dtype`); a type that does
/// not `run` here is an error, never a row of zeros.
pub fn row(dtype: Dtype, b: &[u8], out: &mut [f32]) -> Result<()> {
    let block: fn(&[u8], &mut [f32]) = match dtype {
        Dtype::F32 => |blk, y| y[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
        Dtype::F16 => |blk, y| y[0] = half_at(blk, 0),
        Dtype::BF16 => |blk, y| y[0] = bf16::from_le_bytes([blk[0], blk[1]]).to_f32(),
        Dtype::Q4_0 => q4_0,
        Dtype::Q4_1 => q4_1,
        Dtype::Q5_0 => q5_0,
        Dtype::Q5_1 => q5_1,
        Dtype::Q8_0 => q8_0,
        Dtype::Q2K => q2_k,
        Dtype::Q3K => q3_k,
        Dtype::Q4K => q4_k,
        Dtype::Q5K => q5_k,
        Dtype::Q6K => q6_k,
        Dtype::IQ4NL => iq4_nl,
        Dtype::IQ4XS => iq4_xs,
        Dtype::Q8_1 | Dtype::Q8K | Dtype::Other(_) => {
            return Err(EngineError::Gguf(format!(
                "{dtype} vectors are not read by this engine"
            )))
        }
    };
    let (per, size) = dtype.block().unwrap_or((1, 1));
    for (blk, y) in b.chunks_exact(size).zip(out.chunks_exact_mut(per)) {
        block(blk, y);
    }
    Ok(())
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = ((q & 0xf) as i32 - 8) as f32 * d;
        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = (q & 0xf) as f32 * d + m;
        y[j + 16] = (q >> 4) as f32 * d + m;
    }
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for (j, &q) in b[6..22].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = (((q & 0xf) as u32 | h0) as i32 - 16) as f32 * d;
        y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for (j, &q) in b[8..24].iter().enumerate() {
        let h0 = ((qh >> j) << 4) & 0x10;
        let h1 = (qh >> (j + 12)) & 0x10;
        y[j] = ((q & 0xf) as u32 | h0) as f32 * d + m;
        y[j + 16] = ((q >> 4) as u32 | h1) as f32 * d + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..34].iter().enumerate() {
        y[j] = q as i8 as f32 * d;
    }
}

/// Scale and min `j` of the 12 packed 6-bit pairs of Q4_K and Q5_K.
fn scale_min_k4(j: usize, q: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((q[j] & 63) as f32, (q[j + 4] & 63) as f32)
    } else {
        (
            ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4)) as f32,
            ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as f32,
        )
    }
}

fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[..16], &b[16..80]);
    let (d, min) = (half_at(b, 80), half_at(b, 82));
    let mut is = 0;
    for (half, q) in qs.chunks_exact(32).enumerate() {
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0xf) as f32, min * (sc >> 4) as f32);
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    y[base + l] = dl * ((q[part * 16 + l] >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hm, qs, packed) = (&b[..32], &b[32..96], &b[96..108]);
    let d = half_at(b, 108);
    // Sixteen 6-bit scales: low 4 bits in the first 8 bytes, high 2 bits in the last 4.
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0xf
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    let mut is = 0;
    let mut m = 1u8;
    for (half, q) in qs.chunks_exact(32).enumerate() {
        for j in 0..4 {
            let shift = 2 * j;
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                let base = half * 128 + j * 32 + part * 16;
                for l in 0..16 {
                    let i = part * 16 + l;
                    let v = ((q[i] >> shift) & 3) as i32 - if hm[i] & m != 0 { 0 } else { 4 };
                    y[base + l] = dl * v as f32;
                }
            }
            m <<= 1;
        }
    }
}

fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (half_at(b, 0), half_at(b, 2));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for (c, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        for l in 0..32 {
            y[c * 64 + l] = d * s1 * (q[l] & 0xf) as f32 - min * m1;
            y[c * 64 + 32 + l] = d * s2 * (q[l] >> 4) as f32 - min * m2;
        }
    }
}

fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, min) = (half_at(b, 0), half_at(b, 2));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (c, q) in qs.chunks_exact(32).enumerate() {
        let (s1, m1) = scale_min_k4(2 * c, scales);
        let (s2, m2) = scale_min_k4(2 * c + 1, scales);
        let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            y[c * 64 + l] = d * s1 * ((q[l] & 0xf) + h1) as f32 - min * m1;
            y[c * 64 + 32 + l] = d * s2 * ((q[l] >> 4) + h2) as f32 - min * m2;
        }
    }
}

fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, sc) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    for n in 0..2 {
        let (ql, qh, sc, y) = (
            &ql[n * 64..],
            &qh[n * 32..],
            &sc[n * 8..],
            &mut y[n * 128..],
        );
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8 as f32) * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8 as f32) * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8 as f32) * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8 as f32) * q4 as f32;
        }
    }
}

fn iq4_nl(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * IQ4[(q & 0xf) as usize] as f32;
        y[j + 16] = d * IQ4[(q >> 4) as usize] as f32;
    }
}

fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    let high = u16::from_le_bytes([b[2], b[3]]);
    let (low, qs) = (&b[4..8], &b[8..136]);
    for (ib, q) in qs.chunks_exact(16).enumerate() {
        let ls = ((low[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32
            | ((((high >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        for (j, &v) in q.iter().enumerate() {
            y[ib * 32 + j] = dl * IQ4[(v & 0xf) as usize] as f32;
            y[ib * 32 + j + 16] = dl * IQ4[(v >> 4) as usize] as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every format against the `gguf` package's dequantizer (scripts/ref/dequant_blocks.py):
    /// random blocks, each value equal to within float32 rounding of the order of operations.
    #[test]
    fn every_format_expands_as_the_reference_does() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dequant");
        let formats = [
            ("f16", Dtype::F16),
            ("bf16", Dtype::BF16),
            ("q4_0", Dtype::Q4_0),
            ("q4_1", Dtype::Q4_1),
            ("q5_0", Dtype::Q5_0),
            ("q5_1", Dtype::Q5_1),
            ("q8_0", Dtype::Q8_0),
            ("q2_k", Dtype::Q2K),
            ("q3_k", Dtype::Q3K),
            ("q4_k", Dtype::Q4K),
            ("q5_k", Dtype::Q5K),
            ("q6_k", Dtype::Q6K),
            ("iq4_nl", Dtype::IQ4NL),
            ("iq4_xs", Dtype::IQ4XS),
        ];
        for (name, dtype) in formats {
            assert!(runs(dtype), "{name}");
            let b = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
            let (per, size) = dtype.block().unwrap();
            // bytes + 4 bytes a value: n values take n / per blocks.
            let n = b.len() / (size + 4 * per) * per;
            let (raw, want) = b.split_at(n / per * size);
            let want: Vec<f32> = want
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(want.len(), n, "{name}");
            let mut got = vec![0f32; n];
            row(dtype, raw, &mut got).expect(name);
            // A value may be a difference of two products (scale and min): rounding is
            // relative to the block's largest value.
            for (blk, (g, w)) in got.chunks(per).zip(want.chunks(per)).enumerate() {
                let top = w.iter().fold(0f32, |a, x| a.max(x.abs()));
                for (i, (g, w)) in g.iter().zip(w).enumerate() {
                    let tol = 8.0 * f32::EPSILON * top;
                    assert!(
                        (g - w).abs() <= tol,
                        "{name} block {blk} value {i}: {g} != {w}"
                    );
                }
            }
        }
    }
}
