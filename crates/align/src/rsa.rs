//! RSA (CE-LSLM eqs. 14-15): the cosine-similarity matrix of each representation's tokens, and
//! the Pearson correlation of their lower triangles (diagonal excluded).

/// Cosine similarity between every pair of rows of `x` (`[n, d]`): `n × n`.
pub fn similarity_matrix(x: &[f64], n: usize) -> Vec<f64> {
    let d = x.len().checked_div(n).unwrap_or(0);
    let mut xt = nalgebra::DMatrix::from_column_slice(d, n, &x[..n * d]);
    for mut col in xt.column_iter_mut() {
        let norm = col.norm();
        if norm > 0.0 {
            col /= norm;
        }
    }
    xt.tr_mul(&xt).as_slice().to_vec()
}

/// Pearson correlation of the strict lower triangles of two `n × n` similarity matrices.
pub fn rsa_from_sims(a: &[f64], b: &[f64], n: usize) -> f64 {
    let pairs: Vec<(f64, f64)> = (0..n)
        .flat_map(|i| (0..i).map(move |j| (a[i * n + j], b[i * n + j])))
        .collect();
    let m = pairs.len() as f64;
    if m < 2.0 {
        return 0.0;
    }
    let (ma, mb) = (
        pairs.iter().map(|p| p.0).sum::<f64>() / m,
        pairs.iter().map(|p| p.1).sum::<f64>() / m,
    );
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (x, y) in &pairs {
        cov += (x - ma) * (y - mb);
        va += (x - ma) * (x - ma);
        vb += (y - mb) * (y - mb);
    }
    if va == 0.0 || vb == 0.0 {
        0.0
    } else {
        cov / (va * vb).sqrt()
    }
}

/// RSA between `x` (`[n, dx]`) and `y` (`[n, dy]`).
pub fn rsa(x: &[f64], y: &[f64], n: usize) -> f64 {
    rsa_from_sims(&similarity_matrix(x, n), &similarity_matrix(y, n), n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{matmul, orthogonal, random};

    const N: usize = 30;

    #[test]
    fn a_representation_matches_itself_and_its_rotations_and_scalings() {
        let x = random(N, 10, 7);
        assert!((rsa(&x, &x, N) - 1.0).abs() < 1e-12);
        let xq = matmul(&x, &orthogonal(10, 8), N, 10, 10);
        assert!((rsa(&x, &xq, N) - 1.0).abs() < 1e-10);
        let x2: Vec<f64> = x.iter().map(|v| 0.25 * v).collect();
        assert!((rsa(&x, &x2, N) - 1.0).abs() < 1e-12);
        assert!(rsa(&x, &random(N, 10, 9), N).abs() < 0.3);
    }

    #[test]
    fn cosine_similarity_of_known_rows() {
        let s = similarity_matrix(&[1.0, 0.0, 0.0, 2.0, 1.0, 1.0], 3);
        assert!((s[1] - 0.0).abs() < 1e-12); // rows 0 and 1 are orthogonal
        assert!((s[2] - 1.0 / 2f64.sqrt()).abs() < 1e-12);
        assert!((s[4] - 1.0).abs() < 1e-12);
    }
}
