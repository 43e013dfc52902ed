//! Rotary position embedding with a precomputed cos/sin table.

use crate::config::RopeStyle;

pub struct Rope {
    style: RopeStyle,
    half: usize,
    max_pos: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, base: f32, style: RopeStyle, max_pos: usize) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| (base as f64).powf(-(2.0 * i as f64) / head_dim as f64) as f32)
            .collect();
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for f in &inv_freq {
                let theta = (p as f32 * f) as f64;
                cos.push(theta.cos() as f32);
                sin.push(theta.sin() as f32);
            }
        }
        Self {
            style,
            half,
            max_pos,
            cos,
            sin,
        }
    }

    pub fn max_positions(&self) -> usize {
        self.max_pos
    }

    /// Rotate every head of one token's row (`n_heads * head_dim` floats) for position `pos`.
    pub fn apply(&self, row: &mut [f32], pos: usize) {
        self.rotate(row, pos, 1.0);
    }

    /// Undo `apply` (rotate by `-pos`): keys back to position-free form, e.g. to map one
    /// model's keys onto another's whose head size and frequencies differ.
    pub fn unapply(&self, row: &mut [f32], pos: usize) {
        self.rotate(row, pos, -1.0);
    }

    fn rotate(&self, row: &mut [f32], pos: usize, sign: f32) {
        let (cos, sin) = (
            &self.cos[pos * self.half..(pos + 1) * self.half],
            &self.sin[pos * self.half..(pos + 1) * self.half],
        );
        for head in row.chunks_exact_mut(2 * self.half) {
            for i in 0..self.half {
                let (a, b) = match self.style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + self.half),
                };
                let (x0, x1, sn) = (head[a], head[b], sign * sin[i]);
                head[a] = x0 * cos[i] - x1 * sn;
                head[b] = x0 * sn + x1 * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        for style in [RopeStyle::Adjacent, RopeStyle::Neox] {
            let rope = Rope::new(8, 10_000.0, style, 16);
            let x: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
            let mut y = x.clone();
            rope.apply(&mut y, 0);
            assert_eq!(x, y);
            rope.apply(&mut y, 7);
            let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
            assert!((n(&x) - n(&y)).abs() < 1e-4);
        }
    }

    #[test]
    fn unapply_undoes_apply() {
        for style in [RopeStyle::Adjacent, RopeStyle::Neox] {
            let rope = Rope::new(16, 1e6, style, 600);
            let x: Vec<f32> = (0..32).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut y = x.clone();
            rope.apply(&mut y, 517);
            assert!(x.iter().zip(&y).any(|(a, b)| (a - b).abs() > 1e-3));
            rope.unapply(&mut y, 517);
            assert!(x.iter().zip(&y).all(|(a, b)| (a - b).abs() < 1e-5));
        }
    }

    #[test]
    fn relative_position_property() {
        // q.k after rotation depends only on the distance between positions.
        let rope = Rope::new(8, 10_000.0, RopeStyle::Neox, 64);
        let q: Vec<f32> = vec![0.3, -1.0, 0.5, 0.2, 0.9, -0.4, 0.1, 0.7];
        let k: Vec<f32> = vec![-0.2, 0.4, 0.8, -0.6, 0.3, 0.5, -0.9, 0.1];
        let dot = |pq, pk| {
            let (mut a, mut b) = (q.clone(), k.clone());
            rope.apply(&mut a, pq);
            rope.apply(&mut b, pk);
            a.iter().zip(&b).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot(10, 7) - dot(33, 30)).abs() < 1e-4);
    }
}
