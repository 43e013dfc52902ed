//! Linear CKA, HSIC-normalised (CE-LSLM eqs. 12-13):
//! `HSIC(K, L) = tr(K H L H) / (n - 1)^2` with `K = X Xᵀ`, `L = Y Yᵀ`, `H = I - 11ᵀ/n`, and
//! `CKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L))`. Centring the Gram matrix (`H K H`) makes
//! `tr(K H L H)` the Frobenius product of the centred Grams; the `(n - 1)^2` cancels.

/// `H X Xᵀ H` for row-major `x` of `n` rows: an `n × n` matrix.
pub fn centered_gram(x: &[f64], n: usize) -> Vec<f64> {
    let d = x.len().checked_div(n).unwrap_or(0);
    // Column-major view of row-major X is Xᵀ (d × n); centring the columns of X is H X.
    let mut xt = nalgebra::DMatrix::from_column_slice(d, n, &x[..n * d]);
    for mut row in xt.row_iter_mut() {
        let mean = row.sum() / n as f64;
        row.add_scalar_mut(-mean);
    }
    let g = xt.tr_mul(&xt);
    g.as_slice().to_vec()
}

/// CKA from two centred Gram matrices of the same tokens.
pub fn cka_from_grams(k: &[f64], l: &[f64]) -> f64 {
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let denom = (dot(k, k) * dot(l, l)).sqrt();
    if denom == 0.0 {
        0.0
    } else {
        dot(k, l) / denom
    }
}

/// Linear CKA between `x` (`[n, dx]`) and `y` (`[n, dy]`).
pub fn cka(x: &[f64], y: &[f64], n: usize) -> f64 {
    cka_from_grams(&centered_gram(x, n), &centered_gram(y, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{matmul, orthogonal, random};

    const N: usize = 40;

    #[test]
    fn a_representation_matches_itself() {
        let x = random(N, 12, 1);
        assert!((cka(&x, &x, N) - 1.0).abs() < 1e-12);
    }

    /// CE-LSLM App. A: invariant to orthogonal transforms and isotropic scaling of either side.
    #[test]
    fn invariant_to_orthogonal_maps_and_isotropic_scaling() {
        let (x, y) = (random(N, 12, 2), random(N, 7, 3));
        let base = cka(&x, &y, N);
        let xq = matmul(&x, &orthogonal(12, 4), N, 12, 12);
        let x3: Vec<f64> = x.iter().map(|v| 3.5 * v).collect();
        assert!((cka(&xq, &y, N) - base).abs() < 1e-10);
        assert!((cka(&x3, &y, N) - base).abs() < 1e-10);
        assert!((cka(&x, &xq, N) - 1.0).abs() < 1e-10);
        // A representation and a shifted copy (centring removes the offset) match too.
        let shifted: Vec<f64> = x.iter().map(|v| v + 10.0).collect();
        assert!((cka(&x, &shifted, N) - 1.0).abs() < 1e-10);
    }

    #[test]
    fn not_invariant_to_anisotropic_scaling_and_low_for_unrelated_data() {
        let x = random(N, 12, 5);
        let stretched: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 12 == 0 { 20.0 * v } else { *v })
            .collect();
        assert!(cka(&x, &stretched, N) < 0.9);
        let unrelated = random(N, 12, 6);
        assert!(cka(&x, &unrelated, N) < 0.5);
    }

    #[test]
    fn a_hand_computed_value() {
        // x = [0, 1, 2], y = [0, 1, 4] (one feature each): centred x = [-1, 0, 1],
        // y = [-5/3, -2/3, 7/3]; CKA = (x·y)^2 / (|x|^2 |y|^2) = 16 / (2 * 26/3) = 12/13.
        let got = cka(&[0.0, 1.0, 2.0], &[0.0, 1.0, 4.0], 3);
        assert!((got - 12.0 / 13.0).abs() < 1e-12, "{got}");
    }
}
