//! One token of the gated delta rule on one value head's matrix (`recurrent.rs`), row by row of
//! the transposed matrix: decay the row and read it with `k`, write back the error scaled by
//! `beta`, read the row with `q`. Each read is eight interleaved partial sums (a multiply, then
//! an add: never fused) added pairwise, then the rows' tail in order: the portable order.
//! `x86/delta.rs` runs the same operations on 8 lanes, four rows at a time: the same bits.

/// Lanes of a row's partial sums.
pub(crate) const LANES: usize = 8;

/// One token's inputs to a head's step.
#[derive(Clone, Copy)]
pub struct Step<'a> {
    pub k: &'a [f32],
    pub q: &'a [f32],
    pub v: &'a [f32],
    pub beta: f32,
    pub decay: f32,
    pub scale: f32,
}

#[inline(always)]
pub(crate) fn lanes_sum(a: [f32; LANES]) -> f32 {
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

/// Rows `from..` of the matrix `m` (rows of `s.k.len()`), their outputs into `o[from..]`.
pub(crate) fn step_rows(m: &mut [f32], s: &Step, o: &mut [f32], from: usize) {
    let d = s.k.len();
    for (j, mj) in m.chunks_exact_mut(d).enumerate().skip(from) {
        o[j] = row(mj, s, s.v[j]);
    }
}

/// One row: its output, times `scale`. Indexed loops: the lanes are spelled as the SIMD path
/// runs them.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn row(mj: &mut [f32], s: &Step, vj: f32) -> f32 {
    let d = mj.len();
    let whole = d - d % LANES;
    let mut acc = [0f32; LANES];
    for c in (0..whole).step_by(LANES) {
        for l in 0..LANES {
            let a = mj[c + l] * s.decay;
            mj[c + l] = a;
            acc[l] += a * s.k[c + l];
        }
    }
    let mut sk = lanes_sum(acc);
    for i in whole..d {
        let a = mj[i] * s.decay;
        mj[i] = a;
        sk += a * s.k[i];
    }
    let delta = (vj - sk) * s.beta;
    let mut acc = [0f32; LANES];
    for c in (0..whole).step_by(LANES) {
        for l in 0..LANES {
            let a = mj[c + l] + s.k[c + l] * delta;
            mj[c + l] = a;
            acc[l] += a * s.q[c + l];
        }
    }
    let mut out = lanes_sum(acc);
    for i in whole..d {
        let a = mj[i] + s.k[i] * delta;
        mj[i] = a;
        out += a * s.q[i];
    }
    out * s.scale
}
