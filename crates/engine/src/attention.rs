//! Attention over a read-only shared prefix (the cloud prompt's KV) and a private causal
//! segment (the edge prompt and the answer), joined by the log-sum-exp merge of DESIGN.md §2.
//!
//! Every query row keeps a running softmax state `(m, l, acc)` and consumes keys one at a
//! time in absolute position order. Folding the private keys into the state left by the
//! prefix *is* the LSE merge (`merge` below computes it for two independent partials), and
//! because the float operations per query depend only on the keys it sees, not on how rows
//! are batched or how the context is cut into segments, split inference, chunked prefill and
//! one-shot prefill produce bit-identical attention outputs.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::fastexp::exp_neg;
#[cfg(target_arch = "x86_64")]
use crate::fastexp::exp_neg8;
use crate::kv::LayerKv;

/// Largest head dimension the stack buffers hold.
pub const MAX_HEAD_DIM: usize = 256;
/// Keys converted from f16 and scored per block.
const BLOCK: usize = 32;

/// Running softmax over keys for one query and head. `acc / l` is the attention output and
/// `m + ln(l)` its log-sum-exp.
#[derive(Clone)]
pub struct State {
    m: f32,
    l: f32,
    acc: [f32; MAX_HEAD_DIM],
    dim: usize,
}

/// A finished attention partial: normalised output and log-sum-exp of the scores.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    pub out: Vec<f32>,
    pub lse: f32,
}

impl State {
    pub fn new(dim: usize) -> Self {
        assert!(dim <= MAX_HEAD_DIM, "head dim {dim} > {MAX_HEAD_DIM}");
        Self {
            m: f32::NEG_INFINITY,
            l: 0.0,
            acc: [0.0; MAX_HEAD_DIM],
            dim,
        }
    }

    /// Consume `n` keys/values (token-major rows of `dim` f16) for query `q` (pre-scaled).
    pub fn attend(&mut self, q: &[f32], keys: &[f16], values: &[f16], n: usize) {
        simd::attend(self, q, keys, values, n)
    }

    pub fn finish(&self) -> Partial {
        let inv = 1.0 / self.l;
        Partial {
            out: self.acc[..self.dim].iter().map(|a| a * inv).collect(),
            lse: self.m + self.l.ln(),
        }
    }

    fn write_output(&self, out: &mut [f32]) {
        let inv = 1.0 / self.l;
        for (o, a) in out.iter_mut().zip(&self.acc[..self.dim]) {
            *o = a * inv;
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            lanes[i] += x[i] * y[i];
        }
    }
    for (i, (x, y)) in ta.iter().zip(tb).enumerate() {
        lanes[i] += x * y;
    }
    // Fixed pairwise reduction order.
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            lanes[i] += lanes[i + w];
        }
        w /= 2;
    }
    lanes[0]
}

#[inline(always)]
fn attend_impl(st: &mut State, q: &[f32], keys: &[f16], values: &[f16], n: usize) {
    let d = st.dim;
    let mut kbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut vbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut scores = [0f32; BLOCK];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        let kb = &mut kbuf[..nb * d];
        keys[j0 * d..(j0 + nb) * d].convert_to_f32_slice(kb);
        for (s, k) in scores.iter_mut().zip(kb.chunks_exact(d)) {
            *s = dot(q, k);
        }
        let vb = &mut vbuf[..nb * d];
        values[j0 * d..(j0 + nb) * d].convert_to_f32_slice(vb);
        let acc = &mut st.acc[..d];
        for (&s, v) in scores[..nb].iter().zip(vb.chunks_exact(d)) {
            if s > st.m {
                let c = exp_neg(st.m - s);
                st.l *= c;
                for a in acc.iter_mut() {
                    *a *= c;
                }
                st.m = s;
            }
            let p = exp_neg(s - st.m);
            st.l += p;
            for (a, x) in acc.iter_mut().zip(v) {
                *a += p * x;
            }
        }
        j0 += nb;
    }
}

mod simd {
    use super::*;

    pub fn attend(st: &mut State, q: &[f32], k: &[f16], v: &[f16], n: usize) {
        #[cfg(target_arch = "x86_64")]
        if *crate::kernels::LEVEL == crate::kernels::Level::Avx2 && st.dim.is_multiple_of(16) {
            // SAFETY: the CPU supports the features enabled on attend_avx2.
            return unsafe {
                match st.dim {
                    64 => attend_avx2::<64>(st, q, k, v, n),
                    128 => attend_avx2::<128>(st, q, k, v, n),
                    _ => attend_avx2::<0>(st, q, k, v, n),
                }
            };
        }
        attend_impl(st, q, k, v, n)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn half8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// Same arithmetic as `attend_impl` (16 dot lanes, the same reduction tree, no FMA), with
    /// f16 keys and values converted in registers instead of through a buffer.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    /// `D` is the head size when known at compile time (0: `st.dim`), so the common sizes keep
    /// the output accumulator in registers across a block of keys.
    unsafe fn attend_avx2<const D: usize>(
        st: &mut State,
        q: &[f32],
        keys: &[f16],
        values: &[f16],
        n: usize,
    ) {
        use std::arch::x86_64::*;
        let d = if D == 0 { st.dim } else { D };
        let chunks = d / 16;
        let qp = q.as_ptr();
        let (kp, vp) = (keys.as_ptr() as *const u16, values.as_ptr() as *const u16);
        let acc = st.acc.as_mut_ptr();
        let mut j0 = 0;
        while j0 < n {
            // Eight keys at a time: scores, then the running max key by key, so both
            // exponentials can be taken as one vector each with the per-key arguments.
            let nb = 8.min(n - j0);
            let mut s = [0f32; 8];
            for (jj, sj) in s[..nb].iter_mut().enumerate() {
                let kr = kp.add((j0 + jj) * d);
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for c in 0..chunks {
                    let o = c * 16;
                    a0 = _mm256_add_ps(
                        a0,
                        _mm256_mul_ps(_mm256_loadu_ps(qp.add(o)), half8(kr.add(o))),
                    );
                    a1 = _mm256_add_ps(
                        a1,
                        _mm256_mul_ps(_mm256_loadu_ps(qp.add(o + 8)), half8(kr.add(o + 8))),
                    );
                }
                let s8 = _mm256_add_ps(a0, a1);
                let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
                let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
                *sj = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
            }
            let (mut pa, mut ca) = ([0f32; 8], [0f32; 8]);
            let mut grew = [false; 8];
            let mut m = st.m;
            for jj in 0..nb {
                if s[jj] > m {
                    ca[jj] = m - s[jj];
                    grew[jj] = true;
                    m = s[jj];
                }
                pa[jj] = s[jj] - m;
            }
            let mut av = [_mm256_setzero_ps(); MAX_HEAD_DIM / 8];
            for (o, a) in av[..d / 8].iter_mut().enumerate() {
                *a = _mm256_loadu_ps(acc.add(8 * o));
            }
            let (mut p, mut c) = ([0f32; 8], [0f32; 8]);
            _mm256_storeu_ps(p.as_mut_ptr(), exp_neg8(_mm256_loadu_ps(pa.as_ptr())));
            _mm256_storeu_ps(c.as_mut_ptr(), exp_neg8(_mm256_loadu_ps(ca.as_ptr())));
            for jj in 0..nb {
                if grew[jj] {
                    let cv = _mm256_set1_ps(c[jj]);
                    st.l *= c[jj];
                    for a in av[..d / 8].iter_mut() {
                        *a = _mm256_mul_ps(*a, cv);
                    }
                    st.m = s[jj];
                }
                st.l += p[jj];
                let pv = _mm256_set1_ps(p[jj]);
                let vr = vp.add((j0 + jj) * d);
                for (o, a) in av[..d / 8].iter_mut().enumerate() {
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, half8(vr.add(8 * o))));
                }
            }
            for (o, a) in av[..d / 8].iter().enumerate() {
                _mm256_storeu_ps(acc.add(8 * o), *a);
            }
            j0 += nb;
        }
    }
}

/// The exact two-part merge (DESIGN.md §2): softmax over the union of two key sets from the
/// softmaxes over each set and their log-sum-exps.
pub fn merge(a: &Partial, b: &Partial) -> Partial {
    let m = a.lse.max(b.lse);
    let (wa, wb) = ((a.lse - m).exp(), (b.lse - m).exp());
    let z = wa + wb;
    Partial {
        out: a
            .out
            .iter()
            .zip(&b.out)
            .map(|(x, y)| (wa * x + wb * y) / z)
            .collect(),
        lse: m + z.ln(),
    }
}

/// The paper's eq. 5 read with a constant weight: `alpha * A_cloud + (1 - alpha) * A_edge`.
/// Not exact; kept only as an ablation.
pub fn fixed_alpha(a: &Partial, b: &Partial, alpha: f32) -> Vec<f32> {
    a.out
        .iter()
        .zip(&b.out)
        .map(|(x, y)| alpha * x + (1.0 - alpha) * y)
        .collect()
}

/// What one sequence's new rows attend to in one layer.
pub struct KvView<'a> {
    /// Shared read-only prefix; every new row sees all of it.
    pub prefix: Option<&'a LayerKv>,
    /// The sequence's own KV, already holding the new rows' K/V at its end.
    pub private: &'a LayerKv,
    /// How many new rows (the last ones in `private`).
    pub rows: usize,
}

/// Prefix keys read per tile, for every query that shares the prefix.
const PREFIX_TILE: usize = 64;

/// One query row and head of the batch.
#[derive(Clone, Copy)]
struct Query {
    view: usize,
    /// Row in the batch.
    row: usize,
    /// Row within its view.
    t: usize,
    head: usize,
}

/// Attention for a whole batch (`q`: `[rows, n_head * head_dim]`, RoPE applied; views in row
/// order) into `out` (same shape). Row `t` of a view sees its whole prefix and private keys
/// `0..=before + t`.
///
/// Queries whose sequences share one prefix buffer read it together, one tile of keys at a
/// time, so a batch reads the shared prefix from memory once per step instead of once per
/// sequence (RelayAttention's idea, done as tiling on a CPU). Every query still consumes keys
/// one by one in position order with its own state, so each row's output is bitwise what it
/// would be alone.
pub fn attend_batch(q: &[f32], views: &[KvView], n_head: usize, head_dim: usize, out: &mut [f32]) {
    // Group queries by (what prefix they read, KV head): a group reads the same keys.
    let mut groups: Vec<((usize, usize), Vec<Query>)> = Vec::new();
    let mut row = 0;
    for (vi, v) in views.iter().enumerate() {
        let group = n_head / v.private.n_kv_head;
        // A prefix-free view groups alone; the address of a shared prefix identifies it.
        let key = v
            .prefix
            .map_or(usize::MAX - vi, |p| p as *const LayerKv as usize);
        for t in 0..v.rows {
            for head in 0..n_head {
                let k = (key, head / group);
                let q = Query {
                    view: vi,
                    row,
                    t,
                    head,
                };
                match groups.iter_mut().find(|(gk, _)| *gk == k) {
                    Some((_, qs)) => qs.push(q),
                    None => groups.push((k, vec![q])),
                }
            }
            row += 1;
        }
    }
    let total: usize = groups.iter().map(|(_, qs)| qs.len()).sum();
    let per_task = total
        .div_ceil(4 * rayon::current_num_threads())
        .clamp(1, 32);
    let tasks: Vec<(usize, &[Query])> = groups
        .iter()
        .flat_map(|((_, g), qs)| qs.chunks(per_task).map(move |c| (*g, c)))
        .collect();
    let results: Vec<std::sync::OnceLock<Vec<f32>>> =
        tasks.iter().map(|_| std::sync::OnceLock::new()).collect();
    crate::pool::run(tasks.len(), &|i| {
        let (g, qs) = tasks[i];
        let _ = results[i].set(attend_task(q, views, g, qs, n_head, head_dim));
    });
    for ((_, qs), res) in tasks.iter().zip(&results) {
        let res = res.get().map_or(&[][..], |r| &r[..]);
        for (query, o) in qs.iter().zip(res.chunks_exact(head_dim)) {
            let at = (query.row * n_head + query.head) * head_dim;
            out[at..at + head_dim].copy_from_slice(o);
        }
    }
}

/// Queries `qs`, all on KV head `g` and the same prefix: the shared prefix tile by tile for
/// all of them, then each one's private keys.
fn attend_task(
    q: &[f32],
    views: &[KvView],
    g: usize,
    qs: &[Query],
    n_head: usize,
    head_dim: usize,
) -> Vec<f32> {
    let scale = 1.0 / (head_dim as f32).sqrt();
    let width = n_head * head_dim;
    let mut rows = vec![0f32; qs.len() * head_dim];
    for (query, r) in qs.iter().zip(rows.chunks_exact_mut(head_dim)) {
        let at = query.row * width + query.head * head_dim;
        for (x, &y) in r.iter_mut().zip(&q[at..at + head_dim]) {
            *x = y * scale;
        }
    }
    let mut states: Vec<State> = qs.iter().map(|_| State::new(head_dim)).collect();
    if let Some(p) = qs.first().and_then(|f| views[f.view].prefix) {
        let (keys, values) = (p.keys(g), p.values(g));
        let mut j0 = 0;
        while j0 < p.len() {
            let n = PREFIX_TILE.min(p.len() - j0);
            let (k, v) = (
                &keys[j0 * head_dim..(j0 + n) * head_dim],
                &values[j0 * head_dim..(j0 + n) * head_dim],
            );
            for (st, r) in states.iter_mut().zip(rows.chunks_exact(head_dim)) {
                st.attend(r, k, v, n);
            }
            j0 += n;
        }
    }
    let mut out = vec![0f32; qs.len() * head_dim];
    for (((query, st), r), o) in qs
        .iter()
        .zip(&mut states)
        .zip(rows.chunks_exact(head_dim))
        .zip(out.chunks_exact_mut(head_dim))
    {
        let view = &views[query.view];
        let visible = view.private.len() - view.rows + query.t + 1;
        st.attend(r, view.private.keys(g), view.private.values(g), visible);
        st.write_output(o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn rand_f16(n: usize, seed: &mut u64, scale: f32) -> Vec<f16> {
        (0..n).map(|_| f16::from_f32(lcg(seed) * scale)).collect()
    }

    /// Plain two-pass softmax attention in f64, the independent reference.
    fn reference(q: &[f32], k: &[f16], v: &[f16], n: usize, d: usize) -> Vec<f32> {
        let s: Vec<f64> = (0..n)
            .map(|j| (0..d).map(|i| q[i] as f64 * k[j * d + i].to_f64()).sum())
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = p.iter().sum();
        (0..d)
            .map(|i| ((0..n).map(|j| p[j] * v[j * d + i].to_f64()).sum::<f64>() / z) as f32)
            .collect()
    }

    fn setup(n: usize, d: usize) -> (Vec<f32>, Vec<f16>, Vec<f16>) {
        let mut seed = 7;
        let q = (0..d).map(|_| lcg(&mut seed) * 0.5).collect();
        (
            q,
            rand_f16(n * d, &mut seed, 2.0),
            rand_f16(n * d, &mut seed, 1.0),
        )
    }

    fn run(q: &[f32], k: &[f16], v: &[f16], n: usize, d: usize) -> Partial {
        let mut st = State::new(d);
        st.attend(q, k, v, n);
        st.finish()
    }

    #[test]
    fn matches_two_pass_reference() {
        let (n, d) = (77, 64);
        let (q, k, v) = setup(n, d);
        let got = run(&q, &k, &v, n, d);
        let want = reference(&q, &k, &v, n, d);
        for (a, b) in got.out.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn lse_merge_of_two_segments_is_exact() {
        let (n, d, cut) = (90, 64, 53);
        let (q, k, v) = setup(n, d);
        let whole = run(&q, &k, &v, n, d);
        let cloud = run(&q, &k[..cut * d], &v[..cut * d], cut, d);
        let edge = run(&q, &k[cut * d..], &v[cut * d..], n - cut, d);
        let merged = merge(&cloud, &edge);
        for (a, b) in merged.out.iter().zip(&whole.out) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
        assert!((merged.lse - whole.lse).abs() < 1e-5);
    }

    #[test]
    fn continuing_the_state_is_bit_identical_to_one_pass() {
        let (n, d) = (100, 64);
        let (q, k, v) = setup(n, d);
        let whole = run(&q, &k, &v, n, d);
        for cut in [1, 31, 32, 33, 64, 99] {
            let mut st = State::new(d);
            st.attend(&q, &k[..cut * d], &v[..cut * d], cut);
            st.attend(&q, &k[cut * d..], &v[cut * d..], n - cut);
            assert_eq!(st.finish(), whole, "cut at {cut}");
        }
    }

    #[test]
    fn simd_path_matches_portable_path_bitwise() {
        let (n, d) = (70, 64);
        let (q, k, v) = setup(n, d);
        let mut a = State::new(d);
        a.attend(&q, &k, &v, n);
        let mut b = State::new(d);
        attend_impl(&mut b, &q, &k, &v, n);
        assert_eq!(a.finish(), b.finish());
    }

    #[test]
    fn every_head_size_path_matches_portable_bitwise() {
        // 128 and 64 have their own compiled paths, 48 takes the generic one.
        for (n, d) in [(37, 128), (9, 64), (70, 48)] {
            let (q, k, v) = setup(n, d);
            let mut a = State::new(d);
            a.attend(&q, &k, &v, n);
            let mut b = State::new(d);
            attend_impl(&mut b, &q, &k, &v, n);
            assert_eq!(a.finish(), b.finish(), "head size {d}");
        }
    }

    fn layer(n: usize, n_kv: usize, d: usize, seed: &mut u64) -> LayerKv {
        let mut l = LayerKv::new(n_kv, d);
        let k: Vec<f32> = (0..n * n_kv * d).map(|_| lcg(seed)).collect();
        let v: Vec<f32> = (0..n * n_kv * d).map(|_| lcg(seed)).collect();
        l.append(&k, &v, n);
        l
    }

    /// Sequences sharing one prefix buffer, attended as one batch, get bitwise the output
    /// each gets alone, and the same as with private copies of the prefix.
    #[test]
    fn shared_prefix_batch_is_bitwise_each_alone() {
        let (n_head, n_kv, d) = (6, 2, 64);
        let mut seed = 11;
        let prefix = layer(150, n_kv, d, &mut seed);
        let copy = prefix.clone();
        // Two decoding sequences and one prefilling 5 rows, private lengths differ.
        let privs = [
            layer(9, n_kv, d, &mut seed),
            layer(1, n_kv, d, &mut seed),
            layer(20, n_kv, d, &mut seed),
        ];
        let rows = [1, 1, 5];
        let total: usize = rows.iter().sum();
        let q: Vec<f32> = (0..total * n_head * d).map(|_| lcg(&mut seed)).collect();
        fn make<'a>(
            pre: [&'a LayerKv; 3],
            privs: &'a [LayerKv],
            rows: &[usize],
        ) -> Vec<KvView<'a>> {
            (0..3)
                .map(|i| KvView {
                    prefix: Some(pre[i]),
                    private: &privs[i],
                    rows: rows[i],
                })
                .collect()
        }
        let views = |pre| make(pre, &privs, &rows);
        let mut shared = vec![0f32; q.len()];
        attend_batch(&q, &views([&prefix; 3]), n_head, d, &mut shared);
        let mut copies = vec![0f32; q.len()];
        attend_batch(
            &q,
            &views([&prefix, &copy, &prefix]),
            n_head,
            d,
            &mut copies,
        );
        assert_eq!(shared, copies);
        let w = n_head * d;
        let mut r0 = 0;
        for (i, v) in views([&prefix; 3]).into_iter().enumerate() {
            let r1 = r0 + rows[i];
            let mut alone = vec![0f32; rows[i] * w];
            attend_batch(&q[r0 * w..r1 * w], &[v], n_head, d, &mut alone);
            assert_eq!(&shared[r0 * w..r1 * w], &alone[..], "sequence {i}");
            // And against the plain reference on the concatenated keys of head 0.
            r0 = r1;
        }
        // Reference check for the first sequence, head 0 (KV head 0).
        let scale = 1.0 / (d as f32).sqrt();
        let qs: Vec<f32> = q[..d].iter().map(|x| x * scale).collect();
        let mut k = prefix.keys(0).to_vec();
        k.extend_from_slice(privs[0].keys(0));
        let mut v = prefix.values(0).to_vec();
        v.extend_from_slice(privs[0].values(0));
        let want = reference(&qs, &k, &v, 159, d);
        for (a, b) in shared[..d].iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    /// EdgePrompt eq. 5 with constant weights (e.g. alpha = 0.5, or alpha = the cloud's share
    /// of tokens) is not attention over the concatenated context: the true weight depends on
    /// each query's scores. This documents why the project uses the LSE weights.
    #[test]
    fn fixed_alpha_fusion_is_not_exact() {
        let (n, d, cut) = (90, 64, 53);
        let (q, k, v) = setup(n, d);
        let whole = run(&q, &k, &v, n, d);
        let cloud = run(&q, &k[..cut * d], &v[..cut * d], cut, d);
        let edge = run(&q, &k[cut * d..], &v[cut * d..], n - cut, d);
        for alpha in [0.5, cut as f32 / n as f32] {
            let fused = fixed_alpha(&cloud, &edge, alpha);
            let err = fused
                .iter()
                .zip(&whole.out)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err > 1e-3, "alpha {alpha}: error {err} unexpectedly small");
        }
        // The exact alpha is sigma(lse_c - lse_e), and with it the fusion is exact.
        let alpha = 1.0 / (1.0 + (edge.lse - cloud.lse).exp());
        let fused = fixed_alpha(&cloud, &edge, alpha);
        for (a, b) in fused.iter().zip(&whole.out) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
