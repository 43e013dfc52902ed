//! The recurrent layers of hybrid models: per layer a state of fixed size that each token
//! updates, instead of KV that grows with the prompt. Gated DeltaNet (Qwen3.5's linear
//! attention) keeps the last `conv_kernel - 1` rows of a short causal convolution's input and a
//! `head_dim` square matrix per value head; LFM2's short convolution keeps only the window.
//!
//! One canonical order of operations: a token's update depends on the state before it and on
//! its own row only, and each is computed token by token in the same order whatever the batch,
//! the chunking, the split between cloud and edge or the threads (heads are independent and
//! run in parallel; a head's tokens never are). The arithmetic is plain f32 in a fixed order,
//! exponentials and logarithms from `exp_neg` and a fixed series (never the platform's libm):
//! the same bits on every CPU, so a state computed in the cloud continues on any edge exactly.

use crate::kernels::delta::Step;
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
}

/// LFM2's short convolution: the input projected to B, C and X (`width` each), `B * X`
/// through a causal depthwise convolution of `kernel` taps, times C. No bias, no activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ShortConv {
    pub kernel: usize,
    pub width: usize,
}

/// What a hybrid's recurrent layers are, and so what their state holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Recurrence {
    DeltaNet(DeltaNet),
    ShortConv(ShortConv),
}

impl Recurrence {
    /// The convolution's taps: the state holds its last `conv_kernel - 1` input rows.
    pub fn conv_kernel(&self) -> usize {
        match self {
            Recurrence::DeltaNet(s) => s.conv_kernel,
            Recurrence::ShortConv(s) => s.kernel,
        }
    }

    /// The convolution's channels.
    pub fn conv_dim(&self) -> usize {
        match self {
            Recurrence::DeltaNet(s) => s.conv_dim(),
            Recurrence::ShortConv(s) => s.width,
        }
    }

    /// Floats of the convolution's carried window.
    pub fn conv_floats(&self) -> usize {
        (self.conv_kernel() - 1) * self.conv_dim()
    }

    /// Floats of the value heads' matrices (none for a short convolution).
    pub fn matrix_floats(&self) -> usize {
        match self {
            Recurrence::DeltaNet(s) => s.v_heads * s.head_dim * s.head_dim,
            Recurrence::ShortConv(_) => 0,
        }
    }

    /// Bytes of one layer's state.
    pub fn state_bytes(&self) -> usize {
        4 * (self.conv_floats() + self.matrix_floats())
    }
}

/// One recurrent layer's state after some positions, exactly as the engine keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Recurrent {
    /// `[conv_kernel - 1, conv_dim]`: the convolution's last input rows, oldest first.
    pub conv: Vec<f32>,
    /// DeltaNet's `[v_heads, head_dim, head_dim]`: head `h`'s matrix stored transposed, row
    /// `j` holding what key dimension `i` writes to value dimension `j` (llama.cpp's layout);
    /// empty for a short convolution.
    pub matrix: Vec<f32>,
}

impl Recurrent {
    /// The state before any token.
    pub fn zero(s: &Recurrence) -> Self {
        Self {
            conv: vec![0.0; s.conv_floats()],
            matrix: vec![0.0; s.matrix_floats()],
        }
    }

    /// Whether it has `s`'s sizes and only finite values (what a state from the wire must).
    pub fn fits(&self, s: &Recurrence) -> bool {
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
    pub fn from_le_bytes(s: &Recurrence, b: &[u8]) -> Option<Self> {
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
    /// `[conv_kernel, conv_dim]`: the taps, oldest input's first, each over every channel.
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

/// Rows of the convolution's output each task makes.
const CONV_ROWS: usize = 16;

/// The causal depthwise convolution of `rows` input rows `x` (`[rows, c]`, `c` =
/// `window.len() / (k - 1)`) after the carried `window`, over `k` taps (`[k, c]`, the oldest
/// input's first), then `post` on each output row; returns the output rows and moves the
/// window on. Each output row reads only input rows, so rows run in parallel; each channel
/// sums its taps oldest first from 0.
pub(crate) fn convolve(
    k: usize,
    taps: &[f32],
    window: &mut [f32],
    x: &[f32],
    rows: usize,
    post: &(dyn Fn(&mut [f32]) + Sync),
) -> Vec<f32> {
    let c = window.len() / (k - 1).max(1);
    let mut input = Vec::with_capacity((k - 1 + rows) * c);
    input.extend_from_slice(window);
    input.extend_from_slice(&x[..rows * c]);
    let mut out = vec![0f32; rows * c];
    let mut pieces: Vec<(usize, &mut [f32])> = out
        .chunks_mut(CONV_ROWS * c)
        .enumerate()
        .map(|(i, o)| (i * CONV_ROWS, o))
        .collect();
    crate::par::each(&mut pieces, 2, &|_, (t0, o)| {
        for (dt, row) in o.chunks_exact_mut(c).enumerate() {
            let t = *t0 + dt;
            row.fill(0.0);
            for i in 0..k {
                let x = &input[(t + i) * c..(t + i + 1) * c];
                let w = &taps[i * c..(i + 1) * c];
                for ((o, &x), &w) in row.iter_mut().zip(x).zip(w) {
                    *o += x * w;
                }
            }
            post(row);
        }
    });
    drop(pieces);
    window.copy_from_slice(&input[rows * c..]);
    out
}

/// DeltaNet's convolution: SiLU, then each Q and K head to unit length (llama.cpp:
/// `x / sqrt(sum x^2 + eps)`).
pub(crate) fn convolve_qkv(s: &DeltaNet, p: &Params, state: &mut Recurrent, r: &Rows) -> Vec<f32> {
    let ones = vec![1f32; s.conv_dim()];
    let post = |row: &mut [f32]| {
        crate::kernels::silu_mul(row, &ones);
        for head in row[..2 * s.key_dim()].chunks_exact_mut(s.head_dim) {
            let ss = head.iter().fold(0f64, |a, &v| a + (v as f64) * (v as f64));
            let inv = (1.0 / (ss + p.eps as f64).sqrt()) as f32;
            head.iter_mut().for_each(|v| *v *= inv);
        }
    };
    convolve(s.conv_kernel, p.conv, &mut state.conv, r.qkv, r.rows, &post)
}

/// LFM2's short convolution of the projected rows `bcx` (`[rows, 3 * width]`: B, C, X):
/// `C * conv(B * X)` (`[rows, width]`), the window in `state` moved on.
pub(crate) fn short_conv(
    s: &ShortConv,
    taps: &[f32],
    state: &mut Recurrent,
    bcx: &[f32],
    rows: usize,
) -> Vec<f32> {
    let w = s.width;
    let mut bx = vec![0f32; rows * w];
    for (o, r) in bx.chunks_exact_mut(w).zip(bcx.chunks_exact(3 * w)) {
        for ((o, &b), &x) in o.iter_mut().zip(&r[..w]).zip(&r[2 * w..]) {
            *o = b * x;
        }
    }
    let mut y = convolve(s.kernel, taps, &mut state.conv, &bx, rows, &|_| {});
    for (o, r) in y.chunks_exact_mut(w).zip(bcx.chunks_exact(3 * w)) {
        for (o, &c) in o.iter_mut().zip(&r[w..2 * w]) {
            *o *= c;
        }
    }
    y
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
    let (mut gate, ones) = (vec![0f32; d], vec![1f32; d]);
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
        // scaled by beta, read with q (`kernels::delta`).
        let step = Step {
            k,
            q,
            v,
            beta,
            decay,
            scale,
        };
        crate::kernels::delta_step(m, &step, o);
        // RMS norm over the head, times SiLU of the output gate.
        let ss = o.iter().fold(0f64, |a, &v| a + (v as f64) * (v as f64));
        let inv = (1.0 / (ss / d as f64 + p.eps as f64).sqrt()) as f32;
        let z = &r.z[t * s.value_dim() + h * d..t * s.value_dim() + (h + 1) * d];
        gate.copy_from_slice(z);
        crate::kernels::silu_mul(&mut gate, &ones[..d]);
        for ((o, &w), &g) in o.iter_mut().zip(p.norm).zip(&gate) {
            *o = *o * inv * w * g;
        }
    }
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
}
