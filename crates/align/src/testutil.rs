//! Small deterministic matrices for the tests.

pub fn random(n: usize, d: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n * d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect()
}

/// `[n, k] × [k, m]`.
pub fn matmul(a: &[f64], b: &[f64], n: usize, k: usize, m: usize) -> Vec<f64> {
    let mut c = vec![0.0; n * m];
    for i in 0..n {
        for t in 0..k {
            for j in 0..m {
                c[i * m + j] += a[i * k + t] * b[t * m + j];
            }
        }
    }
    c
}

/// A `d × d` orthogonal matrix: Gram-Schmidt on random columns.
pub fn orthogonal(d: usize, seed: u64) -> Vec<f64> {
    let r = random(d, d, seed);
    let mut cols: Vec<Vec<f64>> = Vec::new();
    for j in 0..d {
        let mut v: Vec<f64> = (0..d).map(|i| r[i * d + j]).collect();
        for c in &cols {
            let p: f64 = v.iter().zip(c).map(|(a, b)| a * b).sum();
            v.iter_mut().zip(c).for_each(|(a, b)| *a -= p * b);
        }
        let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        v.iter_mut().for_each(|a| *a /= norm);
        cols.push(v);
    }
    (0..d * d).map(|k| cols[k % d][k / d]).collect()
}
