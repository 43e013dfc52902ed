//! RMS normalisation, the one order of operations every layer and every path uses: each
//! row's sum of squares in f64 in index order, so a row's bits never depend on its batch.

/// Each row of `w.len()` values of `x` scaled to unit RMS, times `w`, as a new vector.
pub(crate) fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::new();
    rms_norm_into(x, w, eps, &mut out);
    out
}

/// `rms_norm` into `out` (resized to `x`'s length, every value written).
pub(crate) fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    crate::par::rows2(out, x, w.len(), &|out, x| {
        let d = w.len();
        let inv = inv_rms_rows(x, d, eps);
        for ((row, o), &inv) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(&inv) {
            for ((o, &a), &g) in o.iter_mut().zip(row).zip(w) {
                *o = a * inv * g;
            }
        }
    });
}

/// Each row of `w.len()` values of `x` scaled to unit RMS, times `w`.
pub(crate) fn rms_norm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    crate::par::rows2(x, &[], w.len(), &|x, _| {
        let inv = inv_rms_rows(x, w.len(), eps);
        for (row, &inv) in x.chunks_exact_mut(w.len()).zip(&inv) {
            for (a, &g) in row.iter_mut().zip(w) {
                *a = *a * inv * g;
            }
        }
    });
}

/// Rows summed together in `inv_rms_rows`.
const NORM_ROWS: usize = 8;

/// 1 / RMS of each `d`-wide row of `x` (sum of squares in f64, in index order). A row's sum
/// is one chain of dependent adds; rows run `NORM_ROWS` at a time so their chains overlap
/// (each still adds in its own order: the same bits as one row alone). The sums live in a
/// local array of whole rows' slices, which the compiler keeps in registers (indexing one
/// flat slice kept them on the stack, each add waiting on a store).
#[allow(clippy::needless_range_loop)]
fn inv_rms_rows(x: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let mut inv = Vec::with_capacity(x.len() / d.max(1));
    if d == 0 {
        return inv;
    }
    let mut groups = x.chunks_exact(d * NORM_ROWS);
    for g in &mut groups {
        let rows: [&[f32]; NORM_ROWS] = std::array::from_fn(|r| &g[r * d..(r + 1) * d]);
        let mut ss = [0f64; NORM_ROWS];
        for i in 0..d {
            for r in 0..NORM_ROWS {
                let a = rows[r][i] as f64;
                ss[r] += a * a;
            }
        }
        inv.extend(ss.map(|s| inv_of(s, d, eps)));
    }
    for row in groups.remainder().chunks_exact(d) {
        let ss = row.iter().fold(0f64, |s, &a| s + (a as f64) * (a as f64));
        inv.push(inv_of(ss, d, eps));
    }
    inv
}

fn inv_of(ss: f64, d: usize, eps: f32) -> f32 {
    (1.0 / (ss / d as f64 + eps as f64).sqrt()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / 4e8 - 5.0)
            .collect()
    }

    #[test]
    fn rows_normed_together_match_each_alone_bitwise() {
        let d = 576;
        for rows in [1, 3, 4, 5, 9] {
            let x = values(rows * d, rows as u32);
            let got = inv_rms_rows(&x, d, 1e-5);
            for (row, &g) in x.chunks_exact(d).zip(&got) {
                // One row alone, as the sum of squares was taken before rows were grouped.
                let ss: f64 = row.iter().map(|&a| (a as f64) * (a as f64)).sum();
                let want = (1.0 / (ss / d as f64 + 1e-5f64).sqrt()) as f32;
                assert_eq!(g.to_bits(), want.to_bits());
            }
        }
    }
}
