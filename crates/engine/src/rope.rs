//! Rotary position embedding with a cos/sin table built as far as positions are used: a model
//! that allows 32k positions but serves 2k-token contexts holds 2k rows, not 32k.

use std::sync::RwLock;

use crate::arch::RopeStyle;

/// Positions the table grows by.
const GROW: usize = 2048;

pub struct Rope {
    style: RopeStyle,
    /// Pairs rotated per head (`rope_dims / 2`); dimensions past `rope_dims` pass through.
    half: usize,
    head_dim: usize,
    max_pos: usize,
    inv_freq: Vec<f32>,
    /// cos and sin are scaled by it (LongRoPE's attention factor; 1 otherwise).
    mscale: f32,
    /// cos and sin of positions `0..cos.len() / half`.
    table: RwLock<(Vec<f32>, Vec<f32>)>,
}

impl Rope {
    pub fn new(head_dim: usize, base: f32, style: RopeStyle, max_pos: usize) -> Self {
        Self::partial(head_dim, head_dim, base, style, max_pos, None, 1.0)
    }

    /// RoPE on the first `rope_dims` dimensions of each `head_dim`-wide head, frequency `i`
    /// divided by `factors[i]` when given (Llama 3's `rope_freqs`, LongRoPE's factors), the
    /// rotated values scaled by `mscale`.
    pub fn partial(
        head_dim: usize,
        rope_dims: usize,
        base: f32,
        style: RopeStyle,
        max_pos: usize,
        factors: Option<&[f32]>,
        mscale: f32,
    ) -> Self {
        let half = rope_dims.min(head_dim) / 2;
        let inv_freq: Vec<f32> = (0..half)
            .map(|i| {
                let f = (base as f64).powf(-(2.0 * i as f64) / (2 * half) as f64);
                let d = factors.and_then(|f| f.get(i)).map_or(1.0, |&x| x as f64);
                (f / d) as f32
            })
            .collect();
        Self {
            style,
            half,
            head_dim,
            max_pos,
            inv_freq,
            mscale,
            table: RwLock::new((Vec::new(), Vec::new())),
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

    /// Extend the table past `pos` (each entry is a function of its position alone, so when
    /// it was built never changes a bit).
    fn grow_to(&self, pos: usize) {
        let Ok(mut t) = self.table.write() else {
            return;
        };
        let built = t.0.len() / self.half.max(1);
        if pos < built {
            return;
        }
        let upto = (pos + 1)
            .next_multiple_of(GROW)
            .min(self.max_pos.max(pos + 1));
        let more = (upto - built) * self.half;
        t.0.reserve_exact(more);
        t.1.reserve_exact(more);
        for p in built..upto {
            for f in &self.inv_freq {
                let theta = (p as f32 * f) as f64;
                t.0.push(theta.cos() as f32 * self.mscale);
                t.1.push(theta.sin() as f32 * self.mscale);
            }
        }
    }

    /// Rotate consecutive rows of `width` floats, row `t` at position `pos0 + t` (one table
    /// lookup for the lot: the layer's hot path).
    pub fn apply_rows(&self, rows: &mut [f32], width: usize, pos0: usize) {
        let n = rows.len() / width.max(1);
        self.with_table(pos0 + n.max(1) - 1, |cos, sin| {
            for (t, row) in rows.chunks_exact_mut(width.max(1)).enumerate() {
                self.rotate_with(cos, sin, row, pos0 + t, 1.0);
            }
        });
    }

    fn rotate(&self, row: &mut [f32], pos: usize, sign: f32) {
        self.with_table(pos, |cos, sin| self.rotate_with(cos, sin, row, pos, sign));
    }

    /// `f(cos, sin)` with the table built at least through `last`.
    fn with_table(&self, last: usize, f: impl FnOnce(&[f32], &[f32])) {
        let built = |t: &(Vec<f32>, Vec<f32>)| t.0.len() / self.half.max(1);
        if self.table.read().map_or(true, |t| last >= built(&t)) {
            self.grow_to(last);
        }
        if let Ok(t) = self.table.read() {
            f(&t.0, &t.1);
        }
    }

    fn rotate_with(&self, cos: &[f32], sin: &[f32], row: &mut [f32], pos: usize, sign: f32) {
        let h = self.half;
        let (cos, sin) = (&cos[pos * h..(pos + 1) * h], &sin[pos * h..(pos + 1) * h]);
        for head in row.chunks_exact_mut(self.head_dim.max(1)) {
            for i in 0..h {
                let (a, b) = match self.style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + h),
                };
                let (x0, x1, sn) = (head[a], head[b], sign * sin[i]);
                head[a] = x0 * cos[i] - x1 * sn;
                head[b] = x0 * sn + x1 * cos[i];
            }
        }
    }

    /// Bytes the table holds now.
    pub fn bytes(&self) -> usize {
        self.table
            .read()
            .map_or(0, |t| (t.0.capacity() + t.1.capacity()) * 4)
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

    /// The table grows as positions are used, and entries built late equal entries built
    /// early, bit for bit.
    #[test]
    fn the_table_grows_on_demand_with_the_same_bits() {
        let (a, b) = (
            Rope::new(8, 10_000.0, RopeStyle::Neox, 32_768),
            Rope::new(8, 10_000.0, RopeStyle::Neox, 32_768),
        );
        assert_eq!(a.bytes(), 0);
        let x: Vec<f32> = (0..16).map(|i| (i as f32 * 0.7).cos()).collect();
        let (mut ya, mut yb) = (x.clone(), x.clone());
        b.apply(&mut yb, 9_000); // b builds 0..10240 at once
        a.apply(&mut ya, 5); // a builds 0..2048, then grows
        a.apply(&mut ya.clone(), 4_100);
        let mut za = x.clone();
        a.apply(&mut za, 9_000);
        assert_eq!(za, yb);
        assert!(a.bytes() <= 2 * 10_240 * 4 * 4 + 4096, "{}", a.bytes());
    }

    #[test]
    fn partial_rotation_leaves_the_last_dimensions_and_factors_slow_the_frequencies() {
        for style in [RopeStyle::Adjacent, RopeStyle::Neox] {
            // Two heads of 8, rotating 4 dimensions each.
            let rope = Rope::partial(8, 4, 10_000.0, style, 64, None, 1.0);
            let x: Vec<f32> = (0..16).map(|i| i as f32 + 1.0).collect();
            let mut y = x.clone();
            rope.apply(&mut y, 5);
            for head in 0..2 {
                let (a, b) = (&x[head * 8..head * 8 + 8], &y[head * 8..head * 8 + 8]);
                assert_eq!(a[4..], b[4..], "{style:?}: the unrotated tail");
                assert_ne!(a[..4], b[..4], "{style:?}: the rotated part");
            }
        }
        // A divisor of 2 at position 2p is position p without it.
        let full = Rope::new(4, 100.0, RopeStyle::Neox, 64);
        let slow = Rope::partial(4, 4, 100.0, RopeStyle::Neox, 64, Some(&[2.0, 2.0]), 1.0);
        let (mut a, mut b) = (vec![1.0, 2.0, 3.0, 4.0], vec![1.0, 2.0, 3.0, 4.0]);
        full.apply(&mut a, 3);
        slow.apply(&mut b, 6);
        assert!(
            a.iter().zip(&b).all(|(p, q)| (p - q).abs() < 1e-5),
            "{a:?} {b:?}"
        );
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
