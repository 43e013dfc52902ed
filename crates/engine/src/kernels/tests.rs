use super::*;

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// Random but valid blocks: small positive f16 scales, random payload bytes.
fn random_matrix(format: Format, n: usize, k: usize, seed: &mut u64) -> QMatrix {
    let bb = format.block_bytes();
    let mut data = Vec::with_capacity(n * k / format.block_values() * bb);
    for _ in 0..n * k / format.block_values() {
        let mut blk: Vec<u8> = (0..bb).map(|_| lcg(seed) as u8).collect();
        let d = half::f16::from_f32(0.001 + (lcg(seed) % 1000) as f32 * 1e-5).to_le_bytes();
        let at = if format == Format::Q6K { 208 } else { 0 };
        blk[at..at + 2].copy_from_slice(&d);
        if matches!(format, Format::Q4_1 | Format::Q4K) {
            let m = half::f16::from_f32(0.01 * (lcg(seed) % 7) as f32).to_le_bytes();
            blk[2..4].copy_from_slice(&m);
        }
        data.extend(blk);
    }
    QMatrix::new(format, n, k, data).unwrap()
}

fn random_x(m: usize, k: usize, seed: &mut u64) -> Vec<f32> {
    (0..m * k)
        .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

const FORMATS: [Format; 6] = [
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q8_0,
    Format::Q4K,
    Format::Q6K,
];

#[test]
fn matches_dequantized_f64_reference() {
    let mut seed = 11;
    for f in FORMATS {
        let (n, k, m) = (37, 512, 3);
        let w = random_matrix(f, n, k, &mut seed);
        let x = random_x(m, k, &mut seed);
        let got = w.matmul(&x, m);
        for j in 0..n {
            let row = f.dequantize(&w.data[j * w.row_bytes()..(j + 1) * w.row_bytes()], k);
            for i in 0..m {
                let want: f64 = row
                    .iter()
                    .zip(&x[i * k..(i + 1) * k])
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum();
                let g = got[i * n + j] as f64;
                // 8-bit activations: error ~ |w| |x| / 127 per term, summed in quadrature.
                let scale: f64 = row.iter().map(|a| (*a as f64).powi(2)).sum::<f64>().sqrt();
                assert!(
                    (g - want).abs() < 0.02 * scale + 1e-4,
                    "{f:?} {g} vs {want}"
                );
            }
        }
    }
}

#[test]
fn rows_do_not_depend_on_the_batch() {
    let mut seed = 5;
    for f in FORMATS {
        let (n, k, m) = (21, 768, 9); // 24 blocks of 32 (3 K-blocks)
        let w = random_matrix(f, n, k, &mut seed);
        let x = random_x(m, k, &mut seed);
        let all = w.matmul(&x, m);
        for i in 0..m {
            let one = w.matmul(&x[i * k..(i + 1) * k], 1);
            assert_eq!(&all[i * n..(i + 1) * n], &one[..], "{f:?} row {i}");
        }
    }
}

#[test]
fn simd_and_scalar_paths_agree_bitwise() {
    let mut seed = 9;
    for f in FORMATS {
        // 16-block groups, an 8-block group and (for 32-blocks) a tail.
        let k = if f.block_values() == 256 { 1280 } else { 1312 };
        let w = random_matrix(f, 1, k, &mut seed);
        let x = random_x(1, k, &mut seed);
        let mut un = Unpacked::new(k);
        f.unpack(&w.data, &mut un);
        let a = quantize_row(&x);
        let all = simd::dots_all_paths(&un, &a, f.has_min());
        for (name, v) in &all {
            assert_eq!(
                v.to_bits(),
                all[0].1.to_bits(),
                "{f:?}: {name} differs from portable"
            );
        }
    }
}
