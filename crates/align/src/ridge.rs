//! Ridge least squares `Y ≈ [X, 1] W`: the linear maps from the LLM's K/V to the SLM's.
//! Normal equations with a Cholesky solve; the bias column is not penalised.

use nalgebra::DMatrix;

use crate::{AlignError, Result};

/// A fitted map `y = x W[..din] + W[din]` (row-major `[(din + 1), dout]`, bias last).
#[derive(Debug, Clone, PartialEq)]
pub struct LinearMap {
    pub din: usize,
    pub dout: usize,
    pub w: Vec<f32>,
}

/// Fit on `n` rows of `x` (`[n, din]`) and `y` (`[n, dout]`). `lambda` is relative: the
/// penalty is `lambda * mean(diag(XᵀX))`, so it does not depend on the features' scale.
pub fn fit(x: &[f32], y: &[f32], n: usize, lambda: f64) -> Result<LinearMap> {
    let (din, dout) = (x.len() / n.max(1), y.len() / n.max(1));
    if n == 0 || x.len() != n * din || y.len() != n * dout || din == 0 || dout == 0 {
        return Err(AlignError::Solve(format!(
            "{} and {} floats are not {n} rows",
            x.len(),
            y.len()
        )));
    }
    if n <= din {
        return Err(AlignError::Solve(format!(
            "{n} calibration rows for {din} features: need more tokens"
        )));
    }
    let xa = DMatrix::from_fn(n, din + 1, |i, j| {
        if j < din {
            x[i * din + j] as f64
        } else {
            1.0
        }
    });
    let ym = DMatrix::from_fn(n, dout, |i, j| y[i * dout + j] as f64);
    let mut xtx = xa.tr_mul(&xa);
    let mean_diag = (0..din).map(|i| xtx[(i, i)]).sum::<f64>() / din as f64;
    for i in 0..din {
        xtx[(i, i)] += lambda * mean_diag;
    }
    let xty = xa.tr_mul(&ym);
    let chol = xtx
        .cholesky()
        .ok_or_else(|| AlignError::Solve("XᵀX + λI is not positive definite".into()))?;
    let w = chol.solve(&xty);
    let mut out = Vec::with_capacity((din + 1) * dout);
    for i in 0..=din {
        for j in 0..dout {
            out.push(w[(i, j)] as f32);
        }
    }
    Ok(LinearMap { din, dout, w: out })
}

impl LinearMap {
    /// `[n, din]` -> `[n, dout]`.
    pub fn apply(&self, x: &[f32]) -> Vec<f32> {
        let n = x.len() / self.din.max(1);
        let xm = nalgebra::DMatrixView::from_slice_generic(
            &x[..n * self.din],
            nalgebra::Dyn(self.din),
            nalgebra::Dyn(n),
        );
        let w = nalgebra::DMatrixView::from_slice_generic(
            &self.w[..self.din * self.dout],
            nalgebra::Dyn(self.dout),
            nalgebra::Dyn(self.din),
        );
        // Column-major views of row-major data are transposes: (Wᵀ Xᵀ) = (X W)ᵀ.
        let yt = w * xm;
        let bias = &self.w[self.din * self.dout..];
        let mut y = Vec::with_capacity(n * self.dout);
        for t in 0..n {
            y.extend(yt.column(t).iter().zip(bias).map(|(a, b)| a + b));
        }
        y
    }
}

/// Fraction of the variance of `y` that `pred` explains (1 - SSE / SST), over all columns.
pub fn r_squared(y: &[f32], pred: &[f32], dout: usize) -> f64 {
    let n = y.len() / dout.max(1);
    if n == 0 {
        return 0.0;
    }
    let mut mean = vec![0f64; dout];
    for row in y.chunks_exact(dout) {
        for (m, v) in mean.iter_mut().zip(row) {
            *m += *v as f64 / n as f64;
        }
    }
    let (mut sse, mut sst) = (0f64, 0f64);
    for (i, (a, b)) in y.iter().zip(pred).enumerate() {
        sse += (*a as f64 - *b as f64).powi(2);
        sst += (*a as f64 - mean[i % dout]).powi(2);
    }
    if sst == 0.0 {
        0.0
    } else {
        1.0 - sse / sst
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::random;

    #[test]
    fn recovers_a_known_affine_map() {
        let (n, din, dout) = (200, 6, 3);
        let x: Vec<f32> = random(n, din, 11).iter().map(|v| *v as f32).collect();
        let w: Vec<f32> = random(din + 1, dout, 12)
            .iter()
            .map(|v| *v as f32)
            .collect();
        let truth = LinearMap { din, dout, w };
        let y = truth.apply(&x);
        let got = fit(&x, &y, n, 0.0).unwrap();
        for (a, b) in got.w.iter().zip(&truth.w) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        assert!((r_squared(&y, &got.apply(&x), dout) - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ridge_shrinks_and_too_few_rows_is_an_error() {
        let (n, din, dout) = (50, 4, 2);
        let x: Vec<f32> = random(n, din, 13).iter().map(|v| *v as f32).collect();
        let y: Vec<f32> = random(n, dout, 14).iter().map(|v| *v as f32).collect();
        let norm = |m: &LinearMap| m.w[..din * dout].iter().map(|a| a * a).sum::<f32>();
        let free = fit(&x, &y, n, 0.0).unwrap();
        let shrunk = fit(&x, &y, n, 10.0).unwrap();
        assert!(norm(&shrunk) < norm(&free));
        assert!(fit(&x[..3 * din], &y[..3 * dout], 3, 0.1).is_err());
    }
}
