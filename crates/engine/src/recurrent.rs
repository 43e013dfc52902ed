//! Gated DeltaNet, the linear-attention layers of Qwen3.5: per layer a state of fixed size (the
//! last `conv_kernel - 1` rows of a short causal convolution's input, and a `head_dim` square
//! matrix per value head) that each token updates, instead of KV that grows with the prompt.
//!
//! One canonical order of operations: a token's update depends on the state before it and on
//! its own row only, and each is computed token by token in the same order whatever the batch,
//! the chunking, the split between cloud and edge or the threads (heads are independent and
//! run in parallel; a head's tokens never are). The arithmetic is plain f32 in a fixed order,
//! exponentials and logarithms from `exp_neg` and a fixed series (never the platform's libm):
//! the same bits on every CPU, so a state computed in the cloud continues on any edge exactly.

use crate::kernels::exp::exp_neg;

/// The shape of a model's DeltaNet layers. Keys and values have heads of the same width
/// (`head_dim`, llama.cpp's `ssm.state_size`); value head `h` reads key head `h % k_heads`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeltaNet {
    pub conv_kernel: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub head_dim: usize,
}

impl DeltaNet {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the convolution: Q, K and V rows side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of the convolution's carried window.
    pub fn conv_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }

    /// Floats of the value heads' matrices.
    pub fn matrix_floats(&self) -> usize {
        self.v_heads * self.head_dim * self.head_dim
    }

    /// Bytes of one layer's state.
    pub fn state_bytes(&self) -> usize {
        4 * (self.conv_floats() + self.matrix_floats())
    }
}

/// One DeltaNet layer's state after some positions, exactly as the engine keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recurrent {
    /// `[conv_kernel - 1, conv_dim]`: the convolution's last input rows, oldest first.
    pub conv: Vec<f32>,
    /// `[v_heads, head_dim, head_dim]`: head `h`'s matrix stored transposed, row `j` holding
    /// what key dimension `i` writes to value dimension `j` (llama.cpp's layout).
    pub matrix: Vec<f32>,
}

impl Recurrent {
    /// The state before any token.
    pub fn zero(s: &DeltaNet) -> Self {
        Self {
            conv: vec![0.0; s.conv_floats()],
            matrix: vec![0.0; s.matrix_floats()],
        }
    }

    /// Whether it has `s`'s sizes and only finite values (what a state from the wire must).
    pub fn fits(&self, s: &DeltaNet) -> bool {
        self.conv.len() == s.conv_floats()
            && self.matrix.len() == s.matrix_floats()
            && self.conv.iter().chain(&self.matrix).all(|v| v.is_finite())
    }

    pub fn bytes(&self) -> usize {
        4 * (self.conv.len() + self.matrix.len())
    }

    /// As the wire and every store hold it: f32 little-endian, the window then the matrices.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.conv
            .iter()
            .chain(&self.matrix)
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    /// What `to_le_bytes` wrote for shape `s`: refused unless exactly its size and finite.
    pub fn from_le_bytes(s: &DeltaNet, b: &[u8]) -> Option<Self> {
        if b.len() != s.state_bytes() {
            return None;
        }
        let all: Vec<f32> = b
            .chunks_exact(4)
            .map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
            .collect();
        let mut conv = all;
        let matrix = conv.split_off(s.conv_floats());
        let st = Self { conv, matrix };
        st.fits(s).then_some(st)
    }
}

/// A layer's parameters besides its projections.
pub(crate) struct Params<'a> {
    /// `[conv_dim, conv_kernel]`: each channel's taps, oldest input first.
    pub conv: &'a [f32],
    /// Per value head: the decay's bias (`ssm_dt.bias`) and its rate (`ssm_a`, negative).
    pub dt_bias: &'a [f32],
    pub a: &'a [f32],
    /// The gated RMS norm's weights (`head_dim`).
    pub norm: &'a [f32],
    pub eps: f32,
}

/// One sequence's projected rows: `qkv` `[rows, conv_dim]`, the output gate `z`
/// `[rows, value_dim]`, `beta` and `alpha` `[rows, v_heads]`.
pub(crate) struct Rows<'a> {
    pub qkv: &'a [f32],
    pub z: &'a [f32],
    pub beta: &'a [f32],
    pub alpha: &'a [f32],
    pub rows: usize,
}

/// Run the convolution (and its SiLU) over `r`'s rows after `state`'s window, then the L2 norms
/// of each Q and K head; returns the convolved rows `[rows, conv_dim]` and moves the window on.
pub(crate) fn convolve(s: &DeltaNet, p: &Params, state: &mut Recurrent, r: &Rows) -> Vec<f32> {
    let (c, k) = (s.conv_dim(), s.conv_kernel);
    let mut input = Vec::with_capacity((k - 1 + r.rows) * c);
    input.extend_from_slice(&state.conv);
    input.extend_from_slice(&r.qkv[..r.rows * c]);
    let mut out = vec![0f32; r.rows * c];
    for (t, row) in out.chunks_exact_mut(c).enumerate() {
        for (ch, o) in row.iter_mut().enumerate() {
            let taps = &p.conv[ch * k..(ch + 1) * k];
            let mut sum = 0f32;
            for (i, &w) in taps.iter().enumerate() {
                sum += input[(t + i) * c + ch] * w;
            }
            *o = silu(sum);
        }
        // Q and K heads to unit length (llama.cpp: x / sqrt(sum x^2 + eps)).
        for head in row[..2 * s.key_dim()].chunks_exact_mut(s.head_dim) {
            let ss = head.iter().fold(0f64, |a, &v| a + (v as f64) * (v as f64));
            let inv = (1.0 / (ss + p.eps as f64).sqrt()) as f32;
            head.iter_mut().for_each(|v| *v *= inv);
        }
    }
    state.conv.copy_from_slice(&input[r.rows * c..]);
    out
}

/// The gated delta rule for value head `h` over the convolved rows `x` (`[rows, conv_dim]`),
/// its matrix `m` updated in place; writes the head's gated, normed output rows into `out`
/// (`[rows, head_dim]`).
pub(crate) fn head(
    s: &DeltaNet,
    p: &Params,
    h: usize,
    m: &mut [f32],
    x: &[f32],
    r: &Rows,
    out: &mut [f32],
) {
    let d = s.head_dim;
    let kh = h % s.k_heads;
    let scale = 1.0 / (d as f32).sqrt();
    let c = s.conv_dim();
    for t in 0..r.rows {
        let row = &x[t * c..(t + 1) * c];
        let q = &row[kh * d..(kh + 1) * d];
        let k = &row[s.key_dim() + kh * d..s.key_dim() + (kh + 1) * d];
        let v = &row[2 * s.key_dim() + h * d..2 * s.key_dim() + (h + 1) * d];
        let beta = sigmoid(r.beta[t * s.v_heads + h]);
        let g = softplus(r.alpha[t * s.v_heads + h] + p.dt_bias[h]) * p.a[h];
        let decay = exp(g);
        let o = &mut out[t * d..(t + 1) * d];
        // Row by row of the transposed matrix: decay, read with k, write back the error
        // scaled by beta, read with q.
        for (j, mj) in m.chunks_exact_mut(d).enumerate() {
            mj.iter_mut().for_each(|a| *a *= decay);
            let delta = (v[j] - dot(mj, k)) * beta;
            for (a, &ki) in mj.iter_mut().zip(k) {
                *a += ki * delta;
            }
            o[j] = dot(mj, q) * scale;
        }
        // RMS norm over the head, times SiLU of the output gate.
        let ss = o.iter().fold(0f64, |a, &v| a + (v as f64) * (v as f64));
        let inv = (1.0 / (ss / d as f64 + p.eps as f64).sqrt()) as f32;
        let z = &r.z[t * s.value_dim() + h * d..t * s.value_dim() + (h + 1) * d];
        for ((o, &w), &z) in o.iter_mut().zip(p.norm).zip(z) {
            *o = *o * inv * w * silu(z);
        }
    }
}

/// Lanes of `dot`.
const LANES: usize = 8;

/// `a . b` in one fixed order: eight interleaved partial sums (multiplies and adds, no FMA),
/// added pairwise, then the tail in order. Plain f32 arithmetic: every compiler and CPU gives
/// these bits.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let whole = n - n % LANES;
    let mut acc = [0f32; LANES];
    for (ca, cb) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for i in whole..n {
        sum += a[i] * b[i];
    }
    sum
}

/// `1 / (1 + e^-x)` from `exp_neg` only.
pub(crate) fn sigmoid(x: f32) -> f32 {
    let e = exp_neg(-x.abs());
    if x >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    }
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `e^x` for any `x` (a decay is `e^g` with `g <= 0` from a well-formed file; a positive `g`
/// from a hostile one still gives a defined value).
fn exp(x: f32) -> f32 {
    if x <= 0.0 {
        exp_neg(x)
    } else {
        1.0 / exp_neg(-x)
    }
}

/// `ln(1 + e^x)`, as llama.cpp: `x` itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        return x;
    }
    // max(x, 0) + ln(1 + e^-|x|), the logarithm of a value in (1, 2] by its series.
    let e = exp_neg(-x.abs()) as f64;
    (x.max(0.0) as f64 + ln_1p(e)) as f32
}

/// `ln(1 + y)` for `y` in `[0, 1]`: `2 atanh(y / (2 + y))`, whose argument is at most 1/3, by
/// its series to 20 terms (below f64's precision there), in f64.
fn ln_1p(y: f64) -> f64 {
    let s = y / (2.0 + y);
    let s2 = s * s;
    let mut term = s;
    let mut sum = 0.0;
    for n in 0..20 {
        sum += term / (2 * n + 1) as f64;
        term *= s2;
    }
    2.0 * sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_functions_are_close_to_libm() {
        for i in -400..=400 {
            let x = i as f32 / 10.0;
            let sp = (1.0 + (x as f64).exp()).ln();
            let want = if x > 20.0 { x as f64 } else { sp };
            assert!(
                (softplus(x) as f64 - want).abs() <= 1e-6 * want.abs().max(1e-3),
                "{x}"
            );
            let sg = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!((sigmoid(x) as f64 - sg).abs() < 1e-6, "{x}");
        }
        for i in 0..=1000 {
            let y = i as f64 / 1000.0;
            assert!((ln_1p(y) - y.ln_1p()).abs() < 1e-15, "{y}");
        }
    }

    #[test]
    fn dot_is_the_definition_in_its_order() {
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| (x * y) as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-5);
    }
}
