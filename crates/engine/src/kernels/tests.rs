use super::*;

fn lcg(seed: &mut u64) -> u32 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (*seed >> 33) as u32
}

/// Random but valid blocks: small positive f16 scales, random payload bytes.
fn random_matrix(format: Format, n: usize, k: usize, seed: &mut u64) -> QMatrix {
    QMatrix::new(format, n, k, random_gguf(format, n, k, seed)).unwrap()
}

fn random_gguf(format: Format, n: usize, k: usize, seed: &mut u64) -> Vec<u8> {
    let bb = format.block_bytes();
    let mut data = Vec::with_capacity(n * k / format.block_values() * bb);
    for _ in 0..n * k / format.block_values() {
        let mut blk: Vec<u8> = (0..bb).map(|_| lcg(seed) as u8).collect();
        let d = half::f16::from_f32(0.001 + (lcg(seed) % 1000) as f32 * 1e-5).to_le_bytes();
        let at = match format {
            Format::Q6K => 208,
            Format::Q3K => 108,
            Format::Q2K => 80,
            _ => 0,
        };
        blk[at..at + 2].copy_from_slice(&d);
        if format.has_min() {
            let m = half::f16::from_f32(0.01 * (lcg(seed) % 7) as f32).to_le_bytes();
            blk[at + 2..at + 4].copy_from_slice(&m);
        }
        data.extend(blk);
    }
    data
}

fn random_x(m: usize, k: usize, seed: &mut u64) -> Vec<f32> {
    (0..m * k)
        .map(|_| (lcg(seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

const FORMATS: [Format; 12] = [
    Format::Q4_0,
    Format::Q4_1,
    Format::Q5_0,
    Format::Q5_1,
    Format::Q8_0,
    Format::Q4K,
    Format::Q5K,
    Format::Q6K,
    Format::IQ4NL,
    Format::IQ4XS,
    Format::Q3K,
    Format::Q2K,
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
            let row = w.dequantize_row(j);
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
fn repack_round_trips_every_row() {
    let mut seed = 3;
    for f in FORMATS {
        let (n, k) = (13, 512);
        let gguf = random_gguf(f, n, k, &mut seed);
        let w = QMatrix::new(f, n, k, gguf.clone()).unwrap();
        let rb = gguf.len() / n;
        for j in 0..n {
            assert_eq!(w.gguf_row(j), &gguf[j * rb..(j + 1) * rb], "{f:?} row {j}");
        }
    }
}

#[test]
fn activation_quantization_matches_the_scalar_rows() {
    if !LEVEL.simd() {
        return;
    }
    let mut seed = 17;
    let (m, k) = (5, 320);
    let mut x = random_x(m, k, &mut seed);
    x[7] = 0.0;
    // Exact halves after scaling, and an all-zero block.
    x[32..64].iter_mut().for_each(|v| *v = 0.0);
    x[64] = 127.0;
    x[65] = 2.5;
    x[66] = -0.5;
    for width in [QK, 256] {
        let k = k / width * width;
        let x: Vec<f32> = x.chunks_exact(320).flat_map(|r| r[..k].to_vec()).collect();
        let mut acts = act_quant::Acts::default();
        acts.fill(&x, m, k, width, quantizer(*LEVEL));
        let (nb, ns) = (k / QK, k / width);
        for (i, row) in x.chunks_exact(k).enumerate() {
            let r = quantize_row_by(row, width);
            assert_eq!(&acts.q[i * k..(i + 1) * k], &r.q[..k], "row {i}");
            for s in 0..ns {
                assert_eq!(acts.d[i * ns + s].to_bits(), r.d[s].to_bits());
                assert_eq!(acts.s[i * ns + s].to_bits(), r.s[s].to_bits());
            }
            for b in 0..nb {
                let sum: i32 = r.q[b * QK..(b + 1) * QK].iter().map(|&q| q as i32).sum();
                assert_eq!(acts.bsum[i * nb + b], sum);
            }
        }
    }
}

#[test]
fn activation_rows_cut_over_threads_match_each_row_alone() {
    if !LEVEL.simd() {
        return;
    }
    let mut seed = 23;
    // Enough values that `fill` cuts the rows over the pool, and an odd row count.
    let (m, k) = (33, 512);
    let x = random_x(m, k, &mut seed);
    for width in [QK, 256] {
        let mut all = act_quant::Acts::default();
        all.fill(&x, m, k, width, quantizer(*LEVEL));
        let (nb, ns) = (k / QK, k / width);
        for (i, row) in x.chunks_exact(k).enumerate() {
            let mut one = act_quant::Acts::default();
            one.fill(row, 1, k, width, quantizer(*LEVEL));
            assert_eq!(&all.q[i * k..(i + 1) * k], &one.q[..], "row {i}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all.d[i * ns..(i + 1) * ns]), bits(&one.d));
            assert_eq!(bits(&all.s[i * ns..(i + 1) * ns]), bits(&one.s));
            assert_eq!(&all.bsum[i * nb..(i + 1) * nb], &one.bsum[..]);
            assert_eq!(&all.hpair[i * nb..(i + 1) * nb], &one.hpair[..]);
            if width > QK {
                assert_eq!(&all.bpair[i * nb / 2..(i + 1) * nb / 2], &one.bpair[..]);
            }
        }
    }
}

#[test]
fn gemm_and_portable_paths_agree_bitwise() {
    let mut seed = 9;
    for f in FORMATS {
        // Row counts that leave a partial group; blocks past a multiple of 8; every tile size.
        let k = if f.block_values() == 256 { 1280 } else { 1312 };
        let n = 21;
        let w = random_matrix(f, n, k, &mut seed);
        for m in [1, 2, 3, 4, 5, 9] {
            let x = random_x(m, k, &mut seed);
            let fast = w.matmul(&x, m);
            let mut slow = vec![0f32; m * n];
            w.matmul_portable(&x, m, &mut slow);
            for (a, b) in fast.iter().zip(&slow) {
                assert_eq!(a.to_bits(), b.to_bits(), "{f:?} m={m}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn tiles_with_fewer_terms_than_lanes_give_the_portable_bits() {
    // Fewer than eight float terms per output (blocks of 32, or super-blocks of the K
    // formats): lanes no term reaches are the zero the others start from. Four groups and
    // sixteen rows reach the widest tiles.
    let shapes = [(37, 1), (37, 4), (37, 16), (37, 17)];
    levels_give_the_portable_bits(41, |f| if f.is_k() { 256 } else { 96 }, &shapes);
    levels_give_the_portable_bits(42, |f| if f.is_k() { 1792 } else { 224 }, &shapes);
}

#[test]
fn sixteen_row_tiles_past_eight_terms_give_the_portable_bits() {
    // Sixteen-row tiles (every 512-bit format but q4_K) with more than eight float terms per
    // output (lanes summed after their first), and a row count that leaves a partial tile.
    let k_of = |f: Format| if f.is_k() { 2304 } else { 1312 };
    levels_give_the_portable_bits(43, k_of, &[(37, 16), (37, 33)]);
}

#[test]
fn reused_outputs_keep_nothing_of_before() {
    // Buffers left longer or shorter by earlier calls, every value NaN: the result must be
    // that of fresh buffers, bit for bit, at the new length.
    let mut seed = 31;
    let k = 512;
    let (a, b) = (
        random_matrix(Format::Q4K, 19, k, &mut seed),
        random_matrix(Format::Q8_0, 40, k, &mut seed),
    );
    let mut outs = vec![vec![f32::NAN; 1000], vec![f32::NAN; 3]];
    for m in [5, 1, 12] {
        let x = random_x(m, k, &mut seed);
        let want = matmul_many(&[&a, &b], &x, m);
        outs.iter_mut().flatten().for_each(|v| *v = f32::NAN);
        matmul_many_into(&[&a, &b], &x, m, &mut outs);
        for (got, want) in outs.iter().zip(&want) {
            assert_eq!(got.len(), want.len(), "m={m}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.to_bits(), w.to_bits(), "m={m}: {g} vs {w}");
            }
        }
    }
}

/// A single row over several matrices of one call: the threads' regions and the chunks they
/// take from each other's ends cross the matrices' edges, and every output keeps the portable
/// bits.
#[test]
fn single_rows_over_many_matrices_give_the_portable_bits() {
    let mut seed = 41;
    let k = 512;
    for f in [Format::Q5_0, Format::Q4K, Format::Q5K] {
        let ws: Vec<QMatrix> = [100, 37, 260, 9]
            .iter()
            .map(|&n| random_matrix(f, n, k, &mut seed))
            .collect();
        let refs: Vec<&QMatrix> = ws.iter().collect();
        let x = random_x(1, k, &mut seed);
        let mut outs = vec![Vec::new(); ws.len()];
        for _ in 0..20 {
            matmul_many_into(&refs, &x, 1, &mut outs);
            for (w, got) in ws.iter().zip(&outs) {
                let mut want = vec![0f32; w.n];
                w.matmul_portable(&x, 1, &mut want);
                assert!(got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}

/// Calls of a few rows (served batches) stream like single rows, over regions with the first
/// row tile of each group prefetching; longer calls take the guided tasks. Every path keeps the
/// portable bits on both sides of that line.
#[test]
fn several_rows_over_many_matrices_give_the_portable_bits() {
    let mut seed = 43;
    let k = 512;
    for f in [
        Format::Q4_1,
        Format::Q8_0,
        Format::Q4K,
        Format::Q5K,
        Format::Q6K,
    ] {
        let ws: Vec<QMatrix> = [100, 37, 260, 9]
            .iter()
            .map(|&n| random_matrix(f, n, k, &mut seed))
            .collect();
        let refs: Vec<&QMatrix> = ws.iter().collect();
        for m in [2, 3, 8, 17, 64, 65] {
            let x = random_x(m, k, &mut seed);
            let want: Vec<Vec<f32>> = ws
                .iter()
                .map(|w| {
                    let mut out = vec![0f32; m * w.n];
                    w.matmul_portable(&x, m, &mut out);
                    out
                })
                .collect();
            for level in simd_levels() {
                for _ in 0..3 {
                    let got = matmul_at(level, &refs, &x, m);
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{f:?} m={m} {level:?}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn portable_tiles_give_the_reference_bits() {
    let mut seed = 29;
    for f in FORMATS {
        let k = if f.block_values() == 256 { 1280 } else { 1312 };
        // Partial groups and tiles: 21 and 13 columns, 1 to 9 rows.
        for (n, m) in [(21, 1), (13, 3), (21, 5), (13, 9)] {
            let w = random_matrix(f, n, k, &mut seed);
            let x = random_x(m, k, &mut seed);
            let mut want = vec![0.0; m * n];
            w.matmul_portable(&x, m, &mut want);
            let got = matmul_at(Level::Portable, &[&w], &x, m).remove(0);
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{f:?} n={n} m={m} at {j}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn subnormal_activation_blocks_give_the_reference_bits() {
    let mut seed = 41;
    for f in FORMATS {
        let (n, m, k) = (13, 3, 512);
        let w = random_matrix(f, n, k, &mut seed);
        let mut x = random_x(m, k, &mut seed);
        // A row of subnormal values: the inverses of its scales are infinite, and its outputs
        // are made of those blocks' terms alone.
        for (i, v) in x[..k].iter_mut().enumerate() {
            *v = if i % 3 == 0 {
                -1e-39
            } else {
                3e-40 * (i % 7) as f32
            };
        }
        let mut want = vec![0.0; m * n];
        w.matmul_portable(&x, m, &mut want);
        for level in std::iter::once(Level::Portable).chain(simd_levels()) {
            let got = matmul_at(level, &[&w], &x, m).remove(0);
            for (j, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{level:?} {f:?} at {j}: {a} vs {b}"
                );
            }
        }
    }
}

/// The SIMD paths this CPU can run.
fn simd_levels() -> Vec<Level> {
    if !LEVEL.simd() {
        return Vec::new();
    }
    let mut levels = LEVEL.below();
    levels.push(*LEVEL);
    levels
}

#[test]
fn every_simd_path_gives_the_portable_bits() {
    let mut seed = 23;
    for f in FORMATS {
        let k = if f.block_values() == 256 { 1280 } else { 1312 };
        // 21 rows: a pair of groups and a lone partial one; 13: a pair ending partial.
        for (n, m) in [21, 13]
            .into_iter()
            .flat_map(|n| [1, 2, 3, 4, 5, 9, 17].map(|m| (n, m)))
        {
            let w = random_matrix(f, n, k, &mut seed);
            // Saturated activation blocks too: every |q| = 127 pushes the integer sums to
            // their extremes.
            let mut x = random_x(m, k, &mut seed);
            x[..QK]
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = [1.0, -1.0][i % 2]);
            let mut slow = vec![0f32; m * n];
            w.matmul_portable(&x, m, &mut slow);
            for level in simd_levels() {
                let fast = matmul_at(level, &[&w], &x, m).remove(0);
                for (a, b) in fast.iter().zip(&slow) {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{level:?} {f:?} m={m}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

/// The 512-bit path's four-group tiles (32 weight rows, two per broadcast activation word):
/// whole, ending in a partial group, and followed by a pair and a lone group.
#[test]
fn four_group_tiles_give_the_portable_bits() {
    every_level_gives_the_portable_bits(29, &[(32, 9), (29, 3), (45, 8), (77, 17), (110, 1)]);
}

/// The 512-bit 32-block tiles of sixteen activation rows: exactly sixteen, sixteen and a
/// rest of every smaller height, past the activation chunk (64 rows), on four groups, a pair
/// and a lone group (which stays on eight-row tiles).
#[test]
fn sixteen_row_tiles_give_the_portable_bits() {
    every_level_gives_the_portable_bits(37, &[(40, 16), (45, 31), (21, 33), (56, 70)]);
}

/// Every format at `k` 512 (K formats) or 544, the `(n, m)` shapes: each SIMD level's output
/// has the portable path's bits.
fn every_level_gives_the_portable_bits(seed: u64, shapes: &[(usize, usize)]) {
    levels_give_the_portable_bits(
        seed,
        |f| if f.block_values() == 256 { 512 } else { 544 },
        shapes,
    )
}

/// Every format at `k_of(format)` values a row, the `(n, m)` shapes: each SIMD level's output
/// has the portable path's bits.
fn levels_give_the_portable_bits(
    mut seed: u64,
    k_of: impl Fn(Format) -> usize,
    shapes: &[(usize, usize)],
) {
    for f in FORMATS {
        let k = k_of(f);
        for &(n, m) in shapes {
            let w = random_matrix(f, n, k, &mut seed);
            let x = random_x(m, k, &mut seed);
            let mut slow = vec![0f32; m * n];
            w.matmul_portable(&x, m, &mut slow);
            for level in simd_levels() {
                let fast = matmul_at(level, &[&w], &x, m).remove(0);
                for (j, (a, b)) in fast.iter().zip(&slow).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{level:?} {f:?} k={k} n={n} m={m} at {j}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn guided_tasks_cover_every_group_once_largest_first() {
    for (groups, threads) in [
        (vec![608usize], 2),
        (vec![112, 16, 16], 2),
        (vec![3], 4),
        (vec![0, 5, 0, 7], 1),
    ] {
        let tasks = guided(&groups, threads);
        // In order, contiguous, within one matrix, none empty.
        let mut at = (0, 0);
        for &(j, g0, g1) in &tasks {
            while at.1 == groups[at.0] {
                at = (at.0 + 1, 0);
            }
            assert_eq!((j, g0), at, "{groups:?}: {tasks:?}");
            assert!(g1 > g0 && g1 <= groups[j]);
            at.1 = g1;
        }
        let total: usize = groups.iter().sum();
        assert_eq!(tasks.iter().map(|t| t.2 - t.1).sum::<usize>(), total);
        // Shrinking: no task after the first is larger than the first.
        let first = tasks[0].2 - tasks[0].1;
        assert!(tasks.iter().all(|t| t.2 - t.1 <= first.max(MIN_TASK)));
    }
}

#[test]
fn silu_matches_its_definition_and_every_path_agrees() {
    let g: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) / 25.0).collect();
    let u: Vec<f32> = (0..1001).map(|i| 1.0 + (i % 7) as f32 / 10.0).collect();
    let mut fast = g.clone();
    silu_mul(&mut fast, &u);
    for ((x, y), f) in g.iter().zip(&u).zip(&fast) {
        let want = (*x as f64 / (1.0 + (-*x as f64).exp())) * *y as f64;
        assert!(
            (*f as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{x}: {f} vs {want}"
        );
        assert_eq!(
            f.to_bits(),
            (gated::act1::<false>(*x) * y).to_bits(),
            "{x}: path differs"
        );
    }
}

#[test]
fn the_delta_step_gives_the_portable_bits_on_every_path() {
    let mut seed = 17u64;
    for d in [8usize, 32, 128, 12] {
        let rows = d + 3;
        let v = |seed: &mut u64, n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect()
        };
        let m0 = v(&mut seed, rows * d);
        let (k, q, vals) = (v(&mut seed, d), v(&mut seed, d), v(&mut seed, rows));
        let s = delta::Step {
            k: &k,
            q: &q,
            v: &vals,
            beta: 0.7,
            decay: 0.93,
            scale: 0.125,
        };
        let (mut m_slow, mut o_slow) = (m0.clone(), vec![0f32; rows]);
        delta::step_rows(&mut m_slow, &s, &mut o_slow, 0);
        for level in simd_levels() {
            let (mut m, mut o) = (m0.clone(), vec![0f32; rows]);
            delta_step_at(level, &mut m, &s, &mut o);
            let bits = |x: &[f32]| x.iter().map(|a| a.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&m), bits(&m_slow), "{level:?} d={d}: matrix");
            assert_eq!(bits(&o), bits(&o_slow), "{level:?} d={d}: outputs");
        }
    }
}

#[test]
fn gelu_matches_the_tanh_form_and_every_path_agrees() {
    let g: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) / 50.0).collect();
    let u: Vec<f32> = (0..1003).map(|i| 1.0 + (i % 5) as f32 / 10.0).collect();
    let mut fast = g.clone();
    gelu_mul(&mut fast, &u);
    for ((x, y), f) in g.iter().zip(&u).zip(&fast) {
        let xd = *x as f64;
        let t = ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh();
        let want = 0.5 * xd * (1.0 + t) * *y as f64;
        assert!(
            (*f as f64 - want).abs() <= 2e-6 * want.abs().max(1.0),
            "{x}: {f} vs {want}"
        );
        assert_eq!(
            f.to_bits(),
            (gated::act1::<true>(*x) * y).to_bits(),
            "{x}: path differs"
        );
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn gated_16_and_8_lane_paths_match_the_scalar_bits() {
    if !crate::kernels::LEVEL.wide() {
        return;
    }
    let mut seed = 11u64;
    let g: Vec<f32> = (0..4096)
        .map(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0
        })
        .collect();
    let u: Vec<f32> = g.iter().map(|x| 1.5 - x / 30.0).collect();
    for gelu in [false, true] {
        let (mut wide, mut narrow) = (g.clone(), g.clone());
        // SAFETY: AVX-512 F (and so AVX2) detected; 4096 is whole 16-lane chunks.
        unsafe {
            if gelu {
                x86::gated::gated_mul_avx512::<true>(&mut wide, &u);
                x86::gated::gated_mul_avx2::<true>(&mut narrow, &u);
            } else {
                x86::gated::gated_mul_avx512::<false>(&mut wide, &u);
                x86::gated::gated_mul_avx2::<false>(&mut narrow, &u);
            }
        }
        for (i, (w, n)) in wide.iter().zip(&narrow).enumerate() {
            let x = g[i];
            let want = if gelu {
                gated::act1::<true>(x)
            } else {
                gated::act1::<false>(x)
            } * u[i];
            assert_eq!(w.to_bits(), want.to_bits(), "16 lanes, {x}");
            assert_eq!(n.to_bits(), want.to_bits(), "8 lanes, {x}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_lanes_match_the_scalar_bits() {
    if !is_x86_feature_detected!("avx2") {
        return;
    }
    use std::arch::x86_64::*;
    let mut seed = 7u64;
    for _ in 0..20_000 {
        let xs: [f32; 8] = std::array::from_fn(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
        });
        let mut out = [0f32; 8];
        // SAFETY: AVX2 detected above.
        unsafe {
            let v = x86::exp::exp_neg8(_mm256_loadu_ps(xs.as_ptr()));
            _mm256_storeu_ps(out.as_mut_ptr(), v);
        }
        for (x, o) in xs.iter().zip(out) {
            assert_eq!(o.to_bits(), exp::exp_neg(*x).to_bits(), "exp({x})");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_lanes_match_the_scalar_bits() {
    if !crate::kernels::LEVEL.wide() {
        return;
    }
    use std::arch::x86_64::*;
    let special = [
        0.0,
        -0.0,
        -87.0,
        -86.99,
        -100.0,
        f32::NEG_INFINITY,
        f32::NAN,
        -1e-30,
    ];
    let mut seed = 9u64;
    for round in 0..20_000 {
        let mut xs: [f32; 16] = std::array::from_fn(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
        });
        if round == 0 {
            xs[..special.len()].copy_from_slice(&special);
        }
        let mut out = [0f32; 16];
        // SAFETY: AVX-512 F detected above (part of the wide level).
        unsafe {
            let v = x86::exp::exp_neg16(_mm512_loadu_ps(xs.as_ptr()));
            _mm512_storeu_ps(out.as_mut_ptr(), v);
        }
        for (x, o) in xs.iter().zip(out) {
            assert_eq!(o.to_bits(), exp::exp_neg(*x).to_bits(), "exp({x})");
        }
    }
}

#[cfg(target_arch = "aarch64")]
#[test]
fn neon_lanes_match_the_scalar_bits() {
    use std::arch::aarch64::*;
    let special = [
        0.0,
        -0.0,
        -87.0,
        -86.99,
        -100.0,
        f32::NEG_INFINITY,
        f32::NAN,
        -1e-30,
    ];
    let mut seed = 5u64;
    for round in 0..20_000 {
        let mut xs: [f32; 8] = std::array::from_fn(|_| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            -((seed >> 40) as f32 / (1u64 << 24) as f32) * 90.0
        });
        if round == 0 {
            xs.copy_from_slice(&special);
        }
        let mut out = [0f32; 8];
        // SAFETY: Advanced SIMD is part of every aarch64 target.
        unsafe {
            for h in 0..2 {
                let v = arm::exp::exp_neg4(vld1q_f32(xs.as_ptr().add(4 * h)));
                vst1q_f32(out.as_mut_ptr().add(4 * h), v);
            }
        }
        for (x, o) in xs.iter().zip(out) {
            assert_eq!(o.to_bits(), exp::exp_neg(*x).to_bits(), "exp({x})");
        }
    }
}

/// Every format's values, as the kernels unpack them from their repacked rows, against the
/// `gguf` package's dequantizer (`tests/fixtures/dequant`, scripts/ref/dequant_blocks.py).
#[test]
fn every_format_unpacks_as_the_reference_dequantizer() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/dequant");
    for (name, f) in [
        ("q4_0", Format::Q4_0),
        ("q4_1", Format::Q4_1),
        ("q5_0", Format::Q5_0),
        ("q5_1", Format::Q5_1),
        ("q8_0", Format::Q8_0),
        ("q4_k", Format::Q4K),
        ("q5_k", Format::Q5K),
        ("q6_k", Format::Q6K),
        ("iq4_nl", Format::IQ4NL),
        ("iq4_xs", Format::IQ4XS),
        ("q3_k", Format::Q3K),
        ("q2_k", Format::Q2K),
    ] {
        let b = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let (per, size) = (f.block_values(), f.block_bytes());
        let n = b.len() / (size + 4 * per) * per;
        let (raw, want) = b.split_at(n / per * size);
        let got = QMatrix::new(f, 1, n, raw.to_vec())
            .unwrap()
            .dequantize_row(0);
        for (blk, (g, w)) in got.chunks(per).zip(want.chunks_exact(4 * per)).enumerate() {
            let w: Vec<f32> = w
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let top = w.iter().fold(0f32, |a, x| a.max(x.abs()));
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                assert!(
                    (g - w).abs() <= 8.0 * f32::EPSILON * top,
                    "{name} block {blk} value {i}: {g} != {w}"
                );
            }
        }
    }
}
