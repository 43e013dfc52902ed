//! A mixture of experts in place of the dense FFN (Qwen3-MoE): each row's router picks its
//! experts, the rows of each expert run together through its gated MLP, and each row sums its
//! experts' outputs weighted by the router.
//!
//! A shared expert (Qwen3.5-MoE) runs every row; its output, scaled by the sigmoid of the
//! row's shared gate logit, is added after the routed sum.
//!
//! Batch invariance holds as for the dense FFN: a row's experts depend on its router logits
//! alone, an expert's matrices give each row the same bits however many rows share the call
//! (our kernels' contract), and each row sums its experts in its own top-k order.

use crate::kernels::exp::exp_neg;
use crate::recurrent::sigmoid;
use crate::weights::{Experts, Linear};
use crate::Result;

/// `out` (`[rows, d]`) = the experts' FFN of `h` (`[rows, d]`).
pub(crate) fn forward(
    x: &Experts,
    h: &[f32],
    rows: usize,
    gelu: bool,
    out: &mut Vec<f32>,
) -> Result<()> {
    let d = x.router.in_dim;
    let count = x.gate.len();
    let logits = x.router.forward(h, rows)?;
    // Each row's experts, best first, and their weights.
    let picks: Vec<Vec<(usize, f32)>> = logits
        .chunks_exact(count.max(1))
        .map(|l| route(l, x.used))
        .collect();
    // The rows of each expert, as (row, the row's k).
    let mut of: Vec<Vec<(usize, usize)>> = vec![Vec::new(); count];
    for (r, p) in picks.iter().enumerate() {
        for (k, &(e, _)) in p.iter().enumerate() {
            of[e].push((r, k));
        }
    }
    // Each (row, k)'s expert output, in place: `ys[(r * used + k) * d..]`.
    let mut ys = vec![0f32; rows * x.used * d];
    let (mut rows_in, mut gate_up, mut y) = (Vec::new(), Vec::new(), Vec::new());
    // Experts that take the same rows (every expert a lone row picks: decode) run their gate
    // and up projections in one call, the rows quantized once and one pool call for all;
    // each row's result is the same either way.
    let active: Vec<usize> = (0..count).filter(|&e| !of[e].is_empty()).collect();
    let mut i = 0;
    while i < active.len() {
        let members = &of[active[i]];
        let rows_of = |e: usize| of[e].iter().map(|m| m.0);
        let same = active[i..]
            .iter()
            .take_while(|&&e| rows_of(e).eq(rows_of(active[i])))
            .count();
        let group = &active[i..i + same];
        i += same;
        rows_in.clear();
        for &(r, _) in members {
            rows_in.extend_from_slice(&h[r * d..(r + 1) * d]);
        }
        let n = members.len();
        let ls: Vec<&Linear> = group.iter().flat_map(|&e| [&x.gate[e], &x.up[e]]).collect();
        gate_up.resize_with(ls.len(), Vec::new);
        Linear::forward_many_into(&ls, &rows_in, n, &mut gate_up[..ls.len()])?;
        for (pair, &e) in gate_up.chunks_exact_mut(2).zip(group) {
            let [g, u] = pair else { continue };
            if gelu {
                crate::kernels::gelu_mul(g, u);
            } else {
                crate::kernels::silu_mul(g, u);
            }
            Linear::forward_many_into(&[&x.down[e]], g, n, std::slice::from_mut(&mut y))?;
            for (i, &(r, k)) in of[e].iter().enumerate() {
                let at = (r * x.used + k) * d;
                ys[at..at + d].copy_from_slice(&y[i * d..(i + 1) * d]);
            }
        }
    }
    out.clear();
    out.resize(rows * d, 0.0);
    for (r, p) in picks.iter().enumerate() {
        let dst = &mut out[r * d..(r + 1) * d];
        for (k, &(_, w)) in p.iter().enumerate() {
            let src = &ys[(r * x.used + k) * d..(r * x.used + k + 1) * d];
            for (o, v) in dst.iter_mut().zip(src) {
                *o += w * v;
            }
        }
    }
    if let Some(s) = &x.shared {
        let logit = s.gate_inp.forward(h, rows)?;
        let mut pair: [Vec<f32>; 2] = Default::default();
        Linear::forward_many_into(&[&s.gate, &s.up], h, rows, &mut pair)?;
        let [g, u] = &mut pair;
        if gelu {
            crate::kernels::gelu_mul(g, u);
        } else {
            crate::kernels::silu_mul(g, u);
        }
        Linear::forward_many_into(&[&s.down], g, rows, std::slice::from_mut(&mut y))?;
        for ((dst, src), &l) in out.chunks_exact_mut(d).zip(y.chunks_exact(d)).zip(&logit) {
            let w = sigmoid(l);
            for (o, v) in dst.iter_mut().zip(src) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

/// A row's `used` experts from its router logits: softmax, the best `used` (ties to the lower
/// index), their probabilities renormalised to sum to one.
fn route(logits: &[f32], used: usize) -> Vec<(usize, f32)> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = logits.iter().map(|&l| exp_neg(l - m)).collect();
    let z: f32 = p.iter().sum();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    order.truncate(used);
    let picked: Vec<(usize, f32)> = order.iter().map(|&e| (e, p[e] / z)).collect();
    let sum: f32 = picked.iter().map(|x| x.1).sum();
    picked.into_iter().map(|(e, w)| (e, w / sum)).collect()
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routes_to_the_best_experts_with_weights_that_sum_to_one() {
        let r = route(&[0.1, 2.0, -1.0, 2.0, 1.5], 3);
        let experts: Vec<usize> = r.iter().map(|x| x.0).collect();
        assert_eq!(experts, vec![1, 3, 4], "ties go to the lower index");
        let sum: f32 = r.iter().map(|x| x.1).sum();
        assert!((sum - 1.0).abs() < 1e-6);
        assert!(r[0].1 == r[1].1 && r[1].1 > r[2].1);
    }
}
