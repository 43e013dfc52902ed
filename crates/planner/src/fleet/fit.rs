//! `Costs` from measured forward passes: least squares on relative error (a 5 ms decode step
//! counts as much as a 2 s prefill), every cost kept non-negative.

use super::model::Costs;
use super::server::Work;

fn features(w: &Work) -> [f64; 4] {
    [
        1.0,
        w.prefill as f64,
        w.decoding as f64,
        w.context + w.prefill_attend,
    ]
}

/// The costs that best predict `points` (the work of a pass, its measured seconds). A term the
/// unconstrained fit makes negative is fixed at zero and the rest refitted. `None` with fewer
/// points than terms or a singular design.
pub fn fit(points: &[(Work, f64)]) -> Option<Costs> {
    let mut used = [true; 4];
    loop {
        let idx: Vec<usize> = (0..4).filter(|&i| used[i]).collect();
        let k = idx.len();
        if points.len() < k {
            return None;
        }
        // Normal equations of the rows scaled by 1 / measured time.
        let mut a = vec![vec![0.0; k + 1]; k];
        for (w, t) in points {
            if *t <= 0.0 {
                continue;
            }
            let x = features(w);
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += x[i] * x[j] / (t * t);
                }
                a[r][k] += x[i] / t;
            }
        }
        let sol = solve(a)?;
        let mut coef = [0.0; 4];
        for (r, &i) in idx.iter().enumerate() {
            coef[i] = sol[r];
        }
        match (0..4).find(|&i| used[i] && coef[i] < 0.0) {
            Some(i) => used[i] = false,
            None => {
                return Some(Costs {
                    fixed: coef[0],
                    per_token: coef[1],
                    per_seq: coef[2],
                    per_attend: coef[3],
                })
            }
        }
    }
}

/// Gaussian elimination with partial pivoting on an augmented matrix.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let piv = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[piv][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, piv);
        let pivot = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let m = row[col] / pivot[col];
                for (x, p) in row.iter_mut().zip(&pivot).skip(col) {
                    *x -= m * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::server::StepCost;

    fn grid() -> Vec<Work> {
        let mut v = Vec::new();
        for n in [16, 64, 256] {
            for o in [0usize, 512] {
                v.push(Work {
                    prefill: n,
                    prefill_attend: n as f64 * (o as f64 + (n as f64 + 1.0) / 2.0),
                    ..Work::default()
                });
            }
        }
        for b in [1, 4, 16] {
            v.push(Work {
                decoding: b,
                context: b as f64 * 600.0,
                ..Work::default()
            });
        }
        v
    }

    #[test]
    fn recovers_the_costs_it_was_measured_with() {
        let truth = Costs {
            fixed: 0.012,
            per_token: 0.0021,
            per_seq: 0.0009,
            per_attend: 3e-8,
        };
        let pts: Vec<(Work, f64)> = grid()
            .into_iter()
            .map(|w| (w, truth.step_secs(&w)))
            .collect();
        let got = fit(&pts).unwrap();
        for (a, b) in [
            (got.fixed, truth.fixed),
            (got.per_token, truth.per_token),
            (got.per_seq, truth.per_seq),
            (got.per_attend, truth.per_attend),
        ] {
            assert!((a - b).abs() <= 1e-9 * b.max(1e-12) + 1e-15, "{got:?}");
        }
    }

    #[test]
    fn a_term_the_data_drive_negative_is_zero() {
        // Decode steps cheaper per sequence than nothing at all would fit a negative per_seq.
        let mut pts: Vec<(Work, f64)> = grid()
            .into_iter()
            .map(|w| (w, 0.01 + 0.002 * w.prefill as f64))
            .collect();
        pts.push((
            Work {
                decoding: 32,
                ..Work::default()
            },
            0.009,
        ));
        let got = fit(&pts).unwrap();
        assert!(
            got.per_seq >= 0.0 && got.per_attend >= 0.0 && got.fixed > 0.0,
            "{got:?}"
        );
        assert!(fit(&pts[..2]).is_none());
    }
}
