//! Attention over a read-only shared prefix (the cloud prompt's KV) and a private causal
//! segment (the edge prompt and the answer), joined by the log-sum-exp merge of docs/design.md §2.
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

#[cfg(target_arch = "x86_64")]
mod few;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "x86_64")]
mod wide;

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

    /// Back to `new(dim)`'s state, zeroing only the accumulator's first `dim` values (the
    /// rest are never read).
    fn reset(&mut self, dim: usize) {
        assert!(dim <= MAX_HEAD_DIM, "head dim {dim} > {MAX_HEAD_DIM}");
        self.m = f32::NEG_INFINITY;
        self.l = 0.0;
        self.acc[..dim].fill(0.0);
        self.dim = dim;
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

/// The canonical score: sixteen lane sums (lane `i` the products of elements `i`, `i + 16`,
/// ... in order), added by a fixed tree. The first sixteen products start the lanes rather
/// than being added to zero: the same values (but for the sign of a zero product), and one
/// add in four fewer at 64-wide heads.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    let (mut ca, mut cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    if let (Some(x), Some(y)) = (ca.next(), cb.next()) {
        for i in 0..16 {
            lanes[i] = x[i] * y[i];
        }
    }
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

/// The scalar reference: keys converted a block at a time, then consumed one by one.
fn attend_impl(st: &mut State, q: &[f32], keys: &[f16], values: &[f16], n: usize) {
    let d = st.dim;
    let mut kbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut vbuf = [0f32; BLOCK * MAX_HEAD_DIM];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        let kb = &mut kbuf[..nb * d];
        keys[j0 * d..(j0 + nb) * d].convert_to_f32_slice(kb);
        let vb = &mut vbuf[..nb * d];
        values[j0 * d..(j0 + nb) * d].convert_to_f32_slice(vb);
        fold_scalar(st, q, kb, vb, nb);
        j0 += nb;
    }
}

/// `n` f32 keys and values consumed one by one, scalar.
#[inline(always)]
fn fold_scalar(st: &mut State, q: &[f32], kb: &[f32], vb: &[f32], n: usize) {
    let d = st.dim;
    let mut scores = [0f32; BLOCK];
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        let (kb, vb) = (&kb[j0 * d..(j0 + nb) * d], &vb[j0 * d..(j0 + nb) * d]);
        for (s, k) in scores.iter_mut().zip(kb.chunks_exact(d)) {
            *s = dot(q, k);
        }
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

    /// Key and value rows as stored (f16) or as a tile converted once (f32).
    #[derive(Clone, Copy)]
    pub enum Kv<'a> {
        F16(&'a [f16], &'a [f16]),
        F32(&'a [f32], &'a [f32]),
    }

    impl Kv<'_> {
        #[cfg(target_arch = "x86_64")]
        fn len(&self) -> usize {
            match self {
                Kv::F16(k, v) => k.len().min(v.len()),
                Kv::F32(k, v) => k.len().min(v.len()),
            }
        }
    }

    /// f16 to f32 (exact either way); `half`'s slice conversion costs a call per 8 values.
    pub fn widen(src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::LEVEL.avx2() {
            // SAFETY: F16C present (part of the AVX2 level).
            return unsafe { widen_f16c(src, dst) };
        }
        #[cfg(target_arch = "aarch64")]
        if crate::kernels::LEVEL.neon() {
            // SAFETY: Advanced SIMD is part of every aarch64 target.
            return unsafe { super::neon::widen(src, dst) };
        }
        src.convert_to_f32_slice(dst)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        assert_eq!(src.len(), dst.len(), "widen lengths");
        let whole = src.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        src[whole..].convert_to_f32_slice(&mut dst[whole..]);
    }

    /// Whether `attend_many` on f16 keys converts them a block at a time for all its queries
    /// (AVX-512's `attend_few` and `attend16`), so a tile copy in f32 would be paid twice.
    pub fn converts_blocks() -> bool {
        cfg!(target_arch = "x86_64") && crate::kernels::LEVEL.wide()
    }

    /// How many sixteens of queries one `attend16` call takes at head size `d` (1 where it
    /// does not run).
    pub fn sixteens(d: usize) -> usize {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::LEVEL.wide() {
            return super::wide::sets_for(d);
        }
        let _ = d;
        1
    }

    /// Whether this state takes the AVX2 path.
    pub fn fast(st: &State) -> bool {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::LEVEL.avx2() && st.dim.is_multiple_of(16) {
            return true;
        }
        let _ = st;
        false
    }

    pub fn attend(st: &mut State, q: &[f32], k: &[f16], v: &[f16], n: usize) {
        if !fast(st) {
            return attend_one(st, q, Kv::F16(k, v), n);
        }
        attend_many(std::slice::from_mut(st), q, Kv::F16(k, v), n)
    }

    /// Every state (query row `i` of `rows`) consumes the same `n` f32 keys and values. Up to
    /// four queries run in lockstep: each key and value row is loaded once for all of them,
    /// and their independent dependency chains overlap.
    pub fn attend_many(states: &mut [State], rows: &[f32], kv: Kv, n: usize) {
        let Some(d) = states.first().map(|s| s.dim) else {
            return;
        };
        #[cfg(target_arch = "x86_64")]
        if fast(&states[0]) {
            assert!(kv.len() >= n * d, "attention keys shorter than {n} rows");
            let mut at = 0;
            if crate::kernels::LEVEL.wide() {
                // SAFETY: AVX-512 F detected (the wide level); the keys and values hold `n`
                // rows of `d` (asserted), a multiple of 16 (`fast`); a row per state.
                at = unsafe {
                    match kv {
                        Kv::F16(k, v) => {
                            wide_all::<true>(states, rows, k.as_ptr() as _, v.as_ptr() as _, n)
                        }
                        Kv::F32(k, v) => {
                            wide_all::<false>(states, rows, k.as_ptr() as _, v.as_ptr() as _, n)
                        }
                    }
                };
            }
            while at < states.len() {
                if let (Kv::F32(k, v), 8..) = (kv, states.len() - at) {
                    let (st, r) = (&mut states[at..at + 8], &rows[at * d..(at + 8) * d]);
                    let (k, v) = (k.as_ptr() as *const u8, v.as_ptr() as *const u8);
                    // SAFETY: as below; eight states and rows.
                    unsafe {
                        match d {
                            64 => attend8::<64>(st, r, k, v, n),
                            128 => attend8::<128>(st, r, k, v, n),
                            _ => attend8::<0>(st, r, k, v, n),
                        }
                    }
                    at += 8;
                    continue;
                }
                // Threes, not a pair and a one: every query's pass reads the keys and values
                // again (a lone SmolLM2 row's attention -23 %, Qwen 0.5B's sevens -7 %).
                let q = match states.len() - at {
                    4 | 7.. => 4,
                    3 | 5 | 6 => 3,
                    2 => 2,
                    _ => 1,
                };
                let (st, r) = (&mut states[at..at + q], &rows[at * d..(at + q) * d]);
                macro_rules! go {
                    ($q:expr, $h:expr, $k:expr, $v:expr) => {
                        // SAFETY: the CPU supports the features enabled on attend_avx2; the
                        // keys and values hold `n` rows of `d` (asserted), `r` `$q` rows.
                        unsafe {
                            let (k, v) = ($k.as_ptr() as *const u8, $v.as_ptr() as *const u8);
                            match d {
                                64 => attend_avx2::<64, $q, $h>(st, r, k, v, n),
                                128 => attend_avx2::<128, $q, $h>(st, r, k, v, n),
                                _ => attend_avx2::<0, $q, $h>(st, r, k, v, n),
                            }
                        }
                    };
                }
                match (q, kv) {
                    (4, Kv::F16(k, v)) => go!(4, true, k, v),
                    (3, Kv::F16(k, v)) => go!(3, true, k, v),
                    (2, Kv::F16(k, v)) => go!(2, true, k, v),
                    (_, Kv::F16(k, v)) => go!(1, true, k, v),
                    (4, Kv::F32(k, v)) => go!(4, false, k, v),
                    (3, Kv::F32(k, v)) => go!(3, false, k, v),
                    (2, Kv::F32(k, v)) => go!(2, false, k, v),
                    (_, Kv::F32(k, v)) => go!(1, false, k, v),
                }
                at += q;
            }
            return;
        }
        for (st, r) in states.iter_mut().zip(rows.chunks_exact(d)) {
            attend_one(st, r, kv, n);
        }
    }

    /// One query without the x86 kernels: Advanced SIMD on aarch64, else the scalar path.
    pub fn attend_one(st: &mut State, q: &[f32], kv: Kv, n: usize) {
        #[cfg(target_arch = "aarch64")]
        if super::neon::usable(st) {
            let d = st.dim;
            // SAFETY: Advanced SIMD present, the head size whole sixteens (`usable`); the
            // kernels check that the keys and values hold `n` rows.
            unsafe {
                match kv {
                    Kv::F16(k, v) => {
                        assert!(k.len() >= n * d && v.len() >= n * d);
                        super::neon::attend(st, q, k, v, n)
                    }
                    Kv::F32(k, v) => super::neon::fold(st, q, k, v, n),
                }
            }
            return;
        }
        match kv {
            Kv::F16(k, v) => attend_impl(st, q, k, v, n),
            Kv::F32(k, v) => fold_scalar(st, q, k, v, n),
        }
    }

    /// On AVX-512: sixteens of queries across the lanes (`attend16`), the rest over blocks
    /// of keys converted in registers once for up to four of them (`attend_few`). One or two
    /// f16 queries are left to the 256-bit kernel: with the keys streamed from memory (a long
    /// decode), `attend_few` took Gemma 3's pairs of queries 1.6-2x as long. Returns how many
    /// states were done.
    ///
    /// # Safety
    /// AVX-512 F present; `k` and `v` hold `n` rows (f16 if `H`, else f32) of the states' head
    /// size, a multiple of 16; `r` a row per state.
    #[cfg(target_arch = "x86_64")]
    unsafe fn wide_all<const H: bool>(
        states: &mut [State],
        r: &[f32],
        k: *const u8,
        v: *const u8,
        n: usize,
    ) -> usize {
        let (lanes, d) = (super::wide::LANES, states[0].dim);
        let whole = states.len() / lanes * lanes;
        let step = lanes * super::wide::sets_for(d);
        for at in (0..whole).step_by(step) {
            let end = whole.min(at + step);
            wide16::<H>(&mut states[at..end], &r[at * d..end * d], k, v, n);
        }
        let (st, r) = (&mut states[whole..], &r[whole * d..]);
        if st.is_empty() || (H && st.len() <= 2) {
            return whole;
        }
        match d {
            64 => super::few::attend_few::<64, H>(st, r, k, v, n),
            128 => super::few::attend_few::<128, H>(st, r, k, v, n),
            256 => super::few::attend_few::<256, H>(st, r, k, v, n),
            _ => super::few::attend_few::<0, H>(st, r, k, v, n),
        }
        states.len()
    }

    /// `attend16` with the head size known at compile time where it is common.
    ///
    /// # Safety
    /// As `attend16`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn wide16<const H: bool>(
        st: &mut [State],
        r: &[f32],
        k: *const u8,
        v: *const u8,
        n: usize,
    ) {
        match st[0].dim {
            64 => super::wide::attend16::<64, H>(st, r, k, v, n),
            128 => super::wide::attend16::<128, H>(st, r, k, v, n),
            _ => super::wide::attend16::<0, H>(st, r, k, v, n),
        }
    }

    /// How many leading states `sixteens_over` takes: the whole sixteens on AVX-512, none
    /// elsewhere.
    pub fn wide_lead(states: &[State]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if crate::kernels::LEVEL.wide() && states.first().is_some_and(fast) {
            return states.len() / super::wide::LANES * super::wide::LANES;
        }
        let _ = states;
        0
    }

    /// The states (`wide_lead` of them: whole sixteens) consume keys `lo..hi` in one pass per
    /// `attend16` call, the f16 keys converted a block at a time inside the kernel: no tile
    /// copies, and the query and state transposes paid once for the whole span.
    pub fn sixteens_over(
        states: &mut [State],
        rows: &[f32],
        keys: &[f16],
        values: &[f16],
        (lo, hi): (usize, usize),
    ) {
        assert_eq!(
            wide_lead(states),
            states.len(),
            "sixteens_over takes whole sixteens on AVX-512"
        );
        if hi <= lo || states.is_empty() {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let d = states[0].dim;
            assert!(
                keys.len().min(values.len()) >= hi * d,
                "attention keys shorter than {hi} rows"
            );
            let (k, v) = (keys[lo * d..].as_ptr(), values[lo * d..].as_ptr());
            let step = super::wide::LANES * super::wide::sets_for(d);
            for at in (0..states.len()).step_by(step) {
                let end = states.len().min(at + step);
                // SAFETY: AVX-512 F detected (`wide_lead`); whole sixteens of states and rows
                // from `at`; the keys and values hold `hi - lo` rows of `d` (a multiple of 16,
                // `fast`) from `lo`.
                unsafe {
                    wide16::<true>(
                        &mut states[at..end],
                        &rows[at * d..end * d],
                        k as *const u8,
                        v as *const u8,
                        hi - lo,
                    )
                };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, keys, values);
    }

    /// Eight dot-product vectors (key `j`'s 16 lanes already folded to 8 in `x[j]`) to the
    /// eight scores, each by the scalar `dot`'s tree: `(l0 + l4) + (l2 + l6)` and
    /// `(l1 + l5) + (l3 + l7)`, added. Transposing shuffles instead of one reduction per key.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn reduce8(x: &[std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // Keys a, b -> [a_i + a_(i+4) | b_i + b_(i+4)], i < 4.
        let halves = |a, b| {
            _mm256_add_ps(
                _mm256_permute2f128_ps::<0x20>(a, b),
                _mm256_permute2f128_ps::<0x31>(a, b),
            )
        };
        let (y01, y23) = (halves(x[0], x[1]), halves(x[2], x[3]));
        let (y45, y67) = (halves(x[4], x[5]), halves(x[6], x[7]));
        // Per 128-bit lane: [a_0 + a_2, a_1 + a_3, b_0 + b_2, b_1 + b_3].
        let quarters = |a, b| {
            _mm256_add_ps(
                _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
                _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
            )
        };
        let (z0, z1) = (quarters(y01, y23), quarters(y45, y67));
        // Keys 0 2 4 6 | 1 3 5 7, then in order.
        let r = _mm256_add_ps(
            _mm256_shuffle_ps::<0b10_00_10_00>(z0, z1),
            _mm256_shuffle_ps::<0b11_01_11_01>(z0, z1),
        );
        _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }

    /// Same arithmetic as `fold_scalar` (16 dot lanes, the same reduction tree, no FMA) for
    /// `Q` queries at once. `D` is the head size when known at compile time (0: the state's).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn attend_avx2<const D: usize, const Q: usize, const H: bool>(
        states: &mut [State],
        rows: &[f32],
        keys: *const u8,
        values: *const u8,
        n: usize,
    ) {
        let d = if D == 0 { states[0].dim } else { D };
        let qp: [*const f32; Q] = std::array::from_fn(|i| rows.as_ptr().add(i * d));
        let mut j0 = 0;
        // Whole blocks get a block size known at compile time: every per-key loop unrolls.
        while j0 + 8 <= n {
            block::<D, Q, H>(states, &qp, keys, values, j0, 8, d);
            j0 += 8;
        }
        if j0 < n {
            block::<D, Q, H>(states, &qp, keys, values, j0, n - j0, d);
        }
    }

    /// Eight values at element `at`: f16 (converted in registers) or f32.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load<const H: bool>(p: *const u8, at: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        if H {
            _mm256_cvtph_ps(_mm_loadu_si128((p as *const u16).add(at) as *const __m128i))
        } else {
            _mm256_loadu_ps((p as *const f32).add(at))
        }
    }

    /// Lanes moved up by `S` (lane `j` takes lane `j - S`), the low lanes filled with -inf.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn shift_up<const S: i32>(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        let idx = _mm256_setr_epi32(-S, 1 - S, 2 - S, 3 - S, 4 - S, 5 - S, 6 - S, 7 - S);
        let moved = _mm256_permutevar8x32_ps(x, _mm256_max_epi32(idx, _mm256_setzero_si256()));
        let low = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32(S),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        _mm256_blendv_ps(moved, _mm256_set1_ps(f32::NEG_INFINITY), low)
    }

    /// The scalar running max `if s > m { m = s }`, key by key from `m`, as a scan: lane `j`
    /// of the first result is the max before key `j`, of the second after it. The step
    /// `max_ps(later, earlier)` keeps the earlier value on ties, as the scalar loop does, and
    /// is associative on non-NaN values (callers turn NaN into -inf), so the tree gives the
    /// loop's bits.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn running_max(
        s: std::arch::x86_64::__m256,
        m: f32,
    ) -> (std::arch::x86_64::__m256, std::arch::x86_64::__m256) {
        use std::arch::x86_64::*;
        let mut x = s;
        x = _mm256_max_ps(x, shift_up::<1>(x));
        x = _mm256_max_ps(x, shift_up::<2>(x));
        x = _mm256_max_ps(x, shift_up::<4>(x));
        let mv = _mm256_set1_ps(m);
        let after = _mm256_max_ps(x, mv);
        let before = _mm256_max_ps(shift_up::<1>(x), mv);
        (before, after)
    }

    /// The scores of keys `j0..j0 + nb` (`nb` <= 8) for `Q` queries, one vector per query
    /// (lane = key; lanes past `nb` are not scores): the scalar `dot` lane by lane.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn scores<const D: usize, const Q: usize, const H: bool>(
        qp: &[*const f32; Q],
        keys: *const u8,
        j0: usize,
        nb: usize,
        d: usize,
    ) -> [std::arch::x86_64::__m256; Q] {
        use std::arch::x86_64::*;
        let chunks = d / 16;
        let mut x = [[_mm256_setzero_ps(); 8]; Q];
        for jj in 0..nb {
            let kr = (j0 + jj) * d;
            let mut a0 = [_mm256_setzero_ps(); Q];
            let mut a1 = [_mm256_setzero_ps(); Q];
            for c in 0..chunks {
                let o = c * 16;
                let (k0, k1) = (load::<H>(keys, kr + o), load::<H>(keys, kr + o + 8));
                for i in 0..Q {
                    let p0 = _mm256_mul_ps(_mm256_loadu_ps(qp[i].add(o)), k0);
                    let p1 = _mm256_mul_ps(_mm256_loadu_ps(qp[i].add(o + 8)), k1);
                    // The first products start the lanes, as in `dot`.
                    (a0[i], a1[i]) = if c == 0 {
                        (p0, p1)
                    } else {
                        (_mm256_add_ps(a0[i], p0), _mm256_add_ps(a1[i], p1))
                    };
                }
            }
            for i in 0..Q {
                x[i][jj] = _mm256_add_ps(a0[i], a1[i]);
            }
        }
        // A loop, not `from_fn`: a closure would not inherit the caller's target features.
        let mut r = [_mm256_setzero_ps(); Q];
        for i in 0..Q {
            r[i] = reduce8(&x[i]);
        }
        r
    }

    /// Eight vectors of eight to their transpose: row `i` lane `j` to row `j` lane `i`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
        use std::arch::x86_64::*;
        let (t0, t1) = (
            _mm256_unpacklo_ps(r[0], r[1]),
            _mm256_unpackhi_ps(r[0], r[1]),
        );
        let (t2, t3) = (
            _mm256_unpacklo_ps(r[2], r[3]),
            _mm256_unpackhi_ps(r[2], r[3]),
        );
        let (t4, t5) = (
            _mm256_unpacklo_ps(r[4], r[5]),
            _mm256_unpackhi_ps(r[4], r[5]),
        );
        let (t6, t7) = (
            _mm256_unpacklo_ps(r[6], r[7]),
            _mm256_unpackhi_ps(r[6], r[7]),
        );
        let (u0, u1) = (
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xEE>(t0, t2),
        );
        let (u2, u3) = (
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xEE>(t1, t3),
        );
        let (w0, w1) = (
            _mm256_shuffle_ps::<0x44>(t4, t6),
            _mm256_shuffle_ps::<0xEE>(t4, t6),
        );
        let (w2, w3) = (
            _mm256_shuffle_ps::<0x44>(t5, t7),
            _mm256_shuffle_ps::<0xEE>(t5, t7),
        );
        [
            _mm256_permute2f128_ps::<0x20>(u0, w0),
            _mm256_permute2f128_ps::<0x20>(u1, w1),
            _mm256_permute2f128_ps::<0x20>(u2, w2),
            _mm256_permute2f128_ps::<0x20>(u3, w3),
            _mm256_permute2f128_ps::<0x31>(u0, w0),
            _mm256_permute2f128_ps::<0x31>(u1, w1),
            _mm256_permute2f128_ps::<0x31>(u2, w2),
            _mm256_permute2f128_ps::<0x31>(u3, w3),
        ]
    }

    /// Eight queries on the same f32 keys. Their softmax bookkeeping runs across queries (lane
    /// = query), key by key in position order: each lane does the scalar loop's operations
    /// (`if s > m { l *= c; acc *= c; m = s }`, `l += p`), with no scan over keys and no
    /// chain of eight scalar adds per block. Lanes that do not grow multiply `l` by exactly 1.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    #[allow(clippy::needless_range_loop)]
    unsafe fn attend8<const D: usize>(
        states: &mut [State],
        rows: &[f32],
        keys: *const u8,
        values: *const u8,
        n: usize,
    ) {
        use std::arch::x86_64::*;
        let d = if D == 0 { states[0].dim } else { D };
        let qp: [*const f32; 8] = std::array::from_fn(|i| rows.as_ptr().add(i * d));
        let (q0, q1): ([*const f32; 4], [*const f32; 4]) = (
            std::array::from_fn(|i| qp[i]),
            std::array::from_fn(|i| qp[4 + i]),
        );
        let mut m = _mm256_loadu_ps(std::array::from_fn::<f32, 8, _>(|i| states[i].m).as_ptr());
        let mut l = _mm256_loadu_ps(std::array::from_fn::<f32, 8, _>(|i| states[i].l).as_ptr());
        let one = _mm256_set1_ps(1.0);
        let mut j0 = 0;
        while j0 < n {
            let nb = 8.min(n - j0);
            let (a, b) = (
                scores::<D, 4, false>(&q0, keys, j0, nb, d),
                scores::<D, 4, false>(&q1, keys, j0, nb, d),
            );
            let t = transpose8([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]);
            // p[key][query], c[key][query]; grew[key]: the queries whose max key `key` raised.
            let mut p = [[0f32; 8]; 8];
            let mut c = [[1f32; 8]; 8];
            let mut grew = [0u32; 8];
            for jj in 0..nb {
                let s = t[jj];
                let up = _mm256_cmp_ps::<_CMP_GT_OQ>(s, m);
                grew[jj] = _mm256_movemask_ps(up) as u32;
                if grew[jj] != 0 {
                    let cj = _mm256_blendv_ps(one, exp_neg8(_mm256_sub_ps(m, s)), up);
                    l = _mm256_mul_ps(l, cj);
                    m = _mm256_blendv_ps(m, s, up);
                    _mm256_storeu_ps(c[jj].as_mut_ptr(), cj);
                }
                let pj = exp_neg8(_mm256_sub_ps(s, m));
                l = _mm256_add_ps(l, pj);
                _mm256_storeu_ps(p[jj].as_mut_ptr(), pj);
            }
            // Values, query by query: up to 8 output vectors in registers, each value row
            // read from memory (L1) in the multiply.
            for i in 0..8 {
                let acc = states[i].acc.as_mut_ptr();
                for o0 in (0..d / 8).step_by(8) {
                    let w = 8.min(d / 8 - o0);
                    let mut v = [_mm256_setzero_ps(); 8];
                    for u in 0..w {
                        v[u] = _mm256_loadu_ps(acc.add(8 * (o0 + u)));
                    }
                    for jj in 0..nb {
                        let vr = (j0 + jj) * d + 8 * o0;
                        if grew[jj] >> i & 1 != 0 {
                            let cv = _mm256_set1_ps(c[jj][i]);
                            for u in 0..w {
                                v[u] = _mm256_mul_ps(v[u], cv);
                            }
                        }
                        let pv = _mm256_set1_ps(p[jj][i]);
                        for u in 0..w {
                            let x = load::<false>(values, vr + 8 * u);
                            v[u] = _mm256_add_ps(v[u], _mm256_mul_ps(pv, x));
                        }
                    }
                    for u in 0..w {
                        _mm256_storeu_ps(acc.add(8 * (o0 + u)), v[u]);
                    }
                }
            }
            j0 += nb;
        }
        let (mut ms, mut ls) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(ms.as_mut_ptr(), m);
        _mm256_storeu_ps(ls.as_mut_ptr(), l);
        for (st, (m, l)) in states.iter_mut().zip(ms.into_iter().zip(ls)) {
            st.m = m;
            st.l = l;
        }
    }

    /// Keys `j0..j0 + nb` (`nb` <= 8) for every query: scores, softmax bookkeeping, values.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    // Key, query and output-vector indices are the layout; index loops say it most plainly.
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    unsafe fn block<const D: usize, const Q: usize, const H: bool>(
        states: &mut [State],
        qp: &[*const f32; Q],
        keys: *const u8,
        values: *const u8,
        j0: usize,
        nb: usize,
        d: usize,
    ) {
        use std::arch::x86_64::*;
        // Output vectors per query updated per pass over the block: 8 registers in all.
        let ob = 8 / Q;
        let sc = scores::<D, Q, H>(qp, keys, j0, nb, d);
        // Lanes past the block never raise the max.
        let valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32(nb as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        ));
        let mut p = [[0f32; 8]; Q];
        let mut c = [[0f32; 8]; Q];
        let mut grew = [0u32; Q];
        for (i, st) in states.iter_mut().enumerate() {
            let s = _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), sc[i], valid);
            // NaN scores never raise the scalar max (`s > m` is false): -inf in the scan.
            let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(s, s);
            let clean = _mm256_blendv_ps(s, _mm256_set1_ps(f32::NEG_INFINITY), nan);
            let (before, after) = running_max(clean, st.m);
            let up = _mm256_cmp_ps::<_CMP_GT_OQ>(s, before);
            grew[i] = _mm256_movemask_ps(up) as u32;
            _mm256_storeu_ps(p[i].as_mut_ptr(), exp_neg8(_mm256_sub_ps(s, after)));
            if grew[i] != 0 {
                let ca = _mm256_and_ps(_mm256_sub_ps(before, s), up);
                _mm256_storeu_ps(c[i].as_mut_ptr(), exp_neg8(ca));
            }
            let mut l = st.l;
            for jj in 0..nb {
                if grew[i] >> jj & 1 != 0 {
                    l *= c[i][jj];
                }
                l += p[i][jj];
            }
            st.l = l;
            st.m = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(
                after,
                _mm256_set1_epi32(nb as i32 - 1),
            ));
        }
        let any = grew.iter().any(|&g| g != 0);
        let accs: [*mut f32; Q] = std::array::from_fn(|i| states[i].acc.as_mut_ptr());
        for o0 in (0..d / 8).step_by(ob) {
            let mut a = [[_mm256_setzero_ps(); 8]; Q];
            for i in 0..Q {
                for u in 0..ob {
                    a[i][u] = _mm256_loadu_ps(accs[i].add(8 * (o0 + u)));
                }
            }
            for jj in 0..nb {
                let vr = (j0 + jj) * d + 8 * o0;
                for i in 0..Q {
                    if any && grew[i] >> jj & 1 != 0 {
                        let cv = _mm256_set1_ps(c[i][jj]);
                        for u in 0..ob {
                            a[i][u] = _mm256_mul_ps(a[i][u], cv);
                        }
                    }
                    let pv = _mm256_set1_ps(p[i][jj]);
                    for u in 0..ob {
                        let v = load::<H>(values, vr + 8 * u);
                        a[i][u] = _mm256_add_ps(a[i][u], _mm256_mul_ps(pv, v));
                    }
                }
            }
            for i in 0..Q {
                for u in 0..ob {
                    _mm256_storeu_ps(accs[i].add(8 * (o0 + u)), a[i][u]);
                }
            }
        }
    }
}

/// The exact two-part merge (docs/design.md §2): softmax over the union of two key sets from the
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

/// Keys converted and read per tile, for every query that shares them.
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
/// `0..=before + t`; with a sliding `window`, only the keys of the last `window` positions
/// up to its own.
///
/// Queries whose sequences share one prefix buffer read it together, one tile of keys at a
/// time, so a batch reads the shared prefix from memory once per step instead of once per
/// sequence (RelayAttention's idea, done as tiling on a CPU). Every query still consumes keys
/// one by one in position order with its own state, so each row's output is bitwise what it
/// would be alone.
pub fn attend_batch(
    q: &[f32],
    views: &[KvView],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    out: &mut [f32],
) {
    // Group queries by (what prefix they read, KV head): a group reads the same keys. A view
    // takes a block of consecutive group ids, one per KV head, shared with the views before it
    // on the same prefix; each group's queries lie together in `flat`, in the order they came.
    // (A linear search of the groups per query cost a batch-32 layer ~10 µs.)
    let mut prefixes: Vec<(*const LayerKv, usize)> = Vec::new();
    let mut heads: Vec<(usize, usize)> = Vec::new();
    let bases: Vec<usize> = views
        .iter()
        .map(|v| {
            let kv_heads = v.private.n_kv_head;
            let known = v.prefix.and_then(|p| {
                prefixes
                    .iter()
                    .find(|(q, _)| std::ptr::eq(*q, p))
                    .map(|&(_, base)| base)
            });
            let base = known.unwrap_or_else(|| {
                heads.extend((0..kv_heads).map(|h| (h, 0)));
                heads.len() - kv_heads
            });
            if let (Some(p), None) = (v.prefix, known) {
                prefixes.push((p, base));
            }
            for h in &mut heads[base..base + kv_heads] {
                h.1 += v.rows * (n_head / kv_heads);
            }
            base
        })
        .collect();
    let mut next: Vec<usize> = heads
        .iter()
        .scan(0, |at, &(_, n)| {
            *at += n;
            Some(*at - n)
        })
        .collect();
    let bounds: Vec<(usize, usize)> = next
        .iter()
        .zip(&heads)
        .map(|(&a, h)| (a, a + h.1))
        .collect();
    let empty = Query {
        view: 0,
        row: 0,
        t: 0,
        head: 0,
    };
    let mut flat = vec![empty; bounds.last().map_or(0, |b| b.1)];
    let mut row = 0;
    for (vi, (v, &base)) in views.iter().zip(&bases).enumerate() {
        let group = n_head / v.private.n_kv_head;
        for t in 0..v.rows {
            for head in 0..n_head {
                let id = base + head / group;
                flat[next[id]] = Query {
                    view: vi,
                    row,
                    t,
                    head,
                };
                next[id] += 1;
            }
            row += 1;
        }
    }
    let groups: Vec<(usize, &[Query])> = bounds
        .iter()
        .zip(&heads)
        .map(|(&(a, b), h)| (h.0, &flat[a..b]))
        .collect();
    let total = flat.len();
    let threads = rayon::current_num_threads();
    // Enough tasks to balance two threads (a batch of 32 on SmolLM2 made nine equal tasks:
    // one thread idle for a ninth of the call), at least two queries each so that a lone
    // sequence's heads still read their keys in lockstep; each group cut in equal chunks,
    // of whole eights once they are longer than four.
    let per_task = total.div_ceil(8 * threads).clamp(2, 32);
    let lanes = if cfg!(target_arch = "x86_64") && crate::kernels::LEVEL.wide() {
        16
    } else {
        8
    };
    // A group of eight or fewer (a lone sequence's heads of one KV head) stays whole when
    // there are groups enough for the threads: each task converts and reads the keys once.
    let whole_small = groups.len() >= threads;
    // Large groups on AVX-512 go in tasks of up to `most` sixteens, which convert each block
    // of keys once for all of them; the tasks shrink as the sixteens left run out (guided
    // self-scheduling: big ones first, single sixteens last to even out the threads).
    let most = simd::sixteens(head_dim);
    let large = |qs: &[Query]| most > 1 && qs.len() >= 2 * lanes;
    let mut left: usize = groups
        .iter()
        .filter(|(_, qs)| large(qs))
        .map(|(_, qs)| qs.len().div_ceil(lanes))
        .sum();
    let mut tasks: Vec<(usize, &[Query])> = Vec::new();
    for &(g, qs) in &groups {
        if large(qs) {
            let mut at = 0;
            while at < qs.len() {
                let k = left.div_ceil(2 * threads).clamp(1, most);
                let end = qs.len().min(at + k * lanes);
                tasks.push((g, &qs[at..end]));
                left = left.saturating_sub((end - at).div_ceil(lanes));
                at = end;
            }
            continue;
        }
        let cuts = if whole_small && qs.len() <= 8 {
            1
        } else {
            qs.len().div_ceil(per_task)
        };
        let mut size = qs.len().div_ceil(cuts);
        if size > 4 {
            // Whole eights (sixteens on AVX-512) run the across-queries kernels.
            size = size.next_multiple_of(lanes);
        }
        tasks.extend(qs.chunks(size.max(1)).map(|c| (g, c)));
    }
    assert_eq!(out.len(), row * n_head * head_dim, "attention output shape");
    let dst = Outputs(out.as_mut_ptr(), out.len());
    crate::pool::run(tasks.len(), &|i| {
        let (g, qs) = tasks[i];
        attend_task(q, views, g, qs, n_head, head_dim, window, &dst);
    });
}

/// `attend_batch`'s output, written by its tasks in place: each (row, head) belongs to one
/// query of one task, so no two tasks write the same values.
struct Outputs(*mut f32, usize);

// SAFETY: tasks write disjoint ranges (above); the pool returns before `out` is used again.
unsafe impl Sync for Outputs {}

impl Outputs {
    /// The `n` values at `at`.
    ///
    /// # Safety
    /// No other task uses them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slot(&self, at: usize, n: usize) -> &mut [f32] {
        assert!(at + n <= self.1, "attention output out of range");
        std::slice::from_raw_parts_mut(self.0.add(at), n)
    }
}

/// Queries `qs`, all on KV head `g` and the same prefix: the shared prefix tile by tile for
/// all of them, then each one's private keys; each query's output into `out`.
#[allow(clippy::too_many_arguments)]
fn attend_task(
    q: &[f32],
    views: &[KvView],
    g: usize,
    qs: &[Query],
    n_head: usize,
    head_dim: usize,
    window: Option<usize>,
    out: &Outputs,
) {
    let scale = 1.0 / (head_dim as f32).sqrt();
    let width = n_head * head_dim;
    let mut rows = ROWS.with(|c| c.take());
    rows.clear();
    rows.resize(qs.len() * head_dim, 0.0);
    for (query, r) in qs.iter().zip(rows.chunks_exact_mut(head_dim)) {
        let at = query.row * width + query.head * head_dim;
        for (x, &y) in r.iter_mut().zip(&q[at..at + head_dim]) {
            *x = y * scale;
        }
    }
    // This thread's states from its last task, reset: fresh ones zeroed a whole
    // `MAX_HEAD_DIM` accumulator each (a batch-32 step's tasks zeroed ~9 MB).
    let mut states = STATES.with(|c| c.take());
    states.truncate(qs.len());
    states.iter_mut().for_each(|s| s.reset(head_dim));
    states.resize_with(qs.len(), || State::new(head_dim));
    // Absolute position of each query, and the first position its window lets it see.
    let pos = |x: &Query| {
        let v = &views[x.view];
        v.prefix.map_or(0, |p| p.end()) + v.private.len() - v.rows + x.t
    };
    let first = |x: &Query| window.map_or(0, |w| (pos(x) + 1).saturating_sub(w));
    if let Some(p) = qs.first().and_then(|f| views[f.view].prefix) {
        let ranges: Vec<(usize, usize)> = qs
            .iter()
            .map(|x| (first(x).saturating_sub(p.start()).min(p.len()), p.len()))
            .collect();
        attend_shared(&mut states, &rows, p.keys(g), p.values(g), &ranges);
    }
    // Queries are in row order, so each view's queries are one run; they share its keys, each
    // up to its causal limit.
    let mut at = 0;
    while at < qs.len() {
        let view = &views[qs[at].view];
        let end = at
            + qs[at..]
                .iter()
                .take_while(|x| x.view == qs[at].view)
                .count();
        let base = view.prefix.map_or(0, |p| p.end());
        let ranges: Vec<(usize, usize)> = qs[at..end]
            .iter()
            .map(|x| {
                let hi = view.private.len() - view.rows + x.t + 1;
                (first(x).saturating_sub(base).min(hi), hi)
            })
            .collect();
        attend_shared(
            &mut states[at..end],
            &rows[at * head_dim..end * head_dim],
            view.private.keys(g),
            view.private.values(g),
            &ranges,
        );
        at = end;
    }
    for (st, x) in states.iter().zip(qs) {
        // SAFETY: this task's query alone writes its (row, head) (`Outputs`).
        st.write_output(unsafe { out.slot((x.row * n_head + x.head) * head_dim, head_dim) });
    }
    STATES.with(|c| c.set(states));
    ROWS.with(|c| c.set(rows));
}

thread_local! {
    /// Running states kept from one attention task to the next on this thread.
    static STATES: std::cell::Cell<Vec<State>> = const { std::cell::Cell::new(Vec::new()) };
    /// The task's scaled queries, kept likewise.
    static ROWS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Each query `i` (state `states[i]`, row `i` of `rows`) consumes keys `ranges[i]` (`lo..hi`):
/// the span every query of the leading sixteens sees in one pass (AVX-512), the rest tile by
/// tile, a tile converted from f16 once and read by every query that sees it.
fn attend_shared(
    states: &mut [State],
    rows: &[f32],
    keys: &[f16],
    values: &[f16],
    ranges: &[(usize, usize)],
) {
    let Some(d) = states.first().map(|s| s.dim) else {
        return;
    };
    if !simd::fast(&states[0]) {
        for ((st, r), &(lo, hi)) in states.iter_mut().zip(rows.chunks_exact(d)).zip(ranges) {
            if hi > lo {
                let kv = simd::Kv::F16(&keys[lo * d..], &values[lo * d..]);
                simd::attend_one(st, r, kv, hi - lo);
            }
        }
        return;
    }
    // On AVX-512 the leading sixteens take the keys they all see (a causal chunk's earlier
    // rows, a shared prefix) in one `attend16` pass: a pass per tile transposed their queries
    // and states in and out each time, a third of `attend16` in a Gemma 3 prefill. Each
    // query's keys before that span go first and the rest after, so every query still takes
    // its keys in order.
    let lead = simd::wide_lead(states);
    let span = (
        ranges[..lead].iter().map(|r| r.0).max().unwrap_or(0),
        ranges[..lead].iter().map(|r| r.1).min().unwrap_or(0),
    );
    if lead == 0 || span.1 <= span.0 {
        return tiles(states, rows, keys, values, ranges);
    }
    let heads: Vec<(usize, usize)> = ranges[..lead].iter().map(|r| (r.0, span.0)).collect();
    tiles(&mut states[..lead], &rows[..lead * d], keys, values, &heads);
    simd::sixteens_over(&mut states[..lead], &rows[..lead * d], keys, values, span);
    let rest: Vec<(usize, usize)> = ranges
        .iter()
        .enumerate()
        .map(|(i, &(lo, hi))| if i < lead { (span.1, hi) } else { (lo, hi) })
        .collect();
    tiles(states, rows, keys, values, &rest);
}

/// `attend_shared`'s tile loop: each query `i` consumes keys `ranges[i]`, tile by tile; the
/// queries that see the same keys of a tile take them in one call.
fn tiles(
    states: &mut [State],
    rows: &[f32],
    keys: &[f16],
    values: &[f16],
    ranges: &[(usize, usize)],
) {
    let Some(d) = states.first().map(|s| s.dim) else {
        return;
    };
    // Few queries convert f16 in registers; more share one f32 copy of each tile, except on
    // AVX-512, where `attend_few` converts blocks of sixteen keys into L1 itself.
    let convert = states.len() > 4 && !simd::converts_blocks();
    let (mut kt, mut vt) = if convert {
        (vec![0f32; PREFIX_TILE * d], vec![0f32; PREFIX_TILE * d])
    } else {
        (Vec::new(), Vec::new())
    };
    // Without a copy a tile only groups the calls: one per run of queries is enough.
    let tile = if convert { PREFIX_TILE } else { usize::MAX };
    let longest = ranges.iter().map(|r| r.1).max().unwrap_or(0);
    let mut j0 = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    while j0 < longest {
        let n = tile.min(longest - j0);
        let (k, v) = (&keys[j0 * d..(j0 + n) * d], &values[j0 * d..(j0 + n) * d]);
        if convert {
            simd::widen(k, &mut kt[..n * d]);
            simd::widen(v, &mut vt[..n * d]);
        }
        // The part of this tile query `i` sees, as offsets into the tile.
        let part = |i: usize| {
            let (lo, hi) = ranges[i];
            let a = lo.clamp(j0, j0 + n) - j0;
            (a, (hi.clamp(j0, j0 + n) - j0).max(a))
        };
        // Runs of queries that take the same keys of this tile go together.
        let mut i = 0;
        while i < states.len() {
            let (a, b) = part(i);
            let end = i
                + 1
                + (i + 1..states.len())
                    .take_while(|&e| part(e) == (a, b))
                    .count();
            if b > a {
                let kv = if convert {
                    simd::Kv::F32(&kt[a * d..], &vt[a * d..])
                } else {
                    simd::Kv::F16(&k[a * d..], &v[a * d..])
                };
                simd::attend_many(&mut states[i..end], &rows[i * d..end * d], kv, b - a);
            }
            i = end;
        }
        j0 += n;
    }
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
    fn non_finite_keys_take_the_portable_path_bits() {
        // Keys from the wire can hold NaN or infinities: both paths must still agree.
        let (n, d) = (40, 64);
        let (q, mut k, v) = setup(n, d);
        k[3 * d] = f16::NAN;
        k[9 * d + 5] = f16::INFINITY;
        k[17 * d + 1] = f16::NEG_INFINITY;
        let mut a = State::new(d);
        a.attend(&q, &k, &v, n);
        let mut b = State::new(d);
        attend_impl(&mut b, &q, &k, &v, n);
        let bits = |p: Partial| {
            (
                p.out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                p.lse.to_bits(),
            )
        };
        assert_eq!(bits(a.finish()), bits(b.finish()));
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

    #[test]
    fn queries_in_lockstep_match_each_alone_bitwise() {
        // Seven queries: lockstep groups (4 and 3 on AVX2); every head size path.
        for (n, d) in [(45, 128), (70, 64), (19, 48)] {
            let (_, k, v) = setup(n, d);
            let mut seed = 3;
            let rows: Vec<f32> = (0..7 * d).map(|_| lcg(&mut seed) * 0.5).collect();
            let (mut kf, mut vf) = (vec![0f32; n * d], vec![0f32; n * d]);
            k.convert_to_f32_slice(&mut kf);
            v.convert_to_f32_slice(&mut vf);
            let mut many: Vec<State> = (0..7).map(|_| State::new(d)).collect();
            simd::attend_many(&mut many, &rows, simd::Kv::F32(&kf, &vf), n);
            let mut direct: Vec<State> = (0..7).map(|_| State::new(d)).collect();
            simd::attend_many(&mut direct, &rows, simd::Kv::F16(&k, &v), n);
            for (i, st) in many.iter().enumerate() {
                let mut alone = State::new(d);
                attend_impl(&mut alone, &rows[i * d..(i + 1) * d], &k, &v, n);
                assert_eq!(st.finish(), alone.finish(), "head size {d}, query {i}");
                assert_eq!(
                    direct[i].finish(),
                    alone.finish(),
                    "f16, head size {d}, query {i}"
                );
            }
        }
    }

    /// Eight queries at a time on f32 keys (softmax across queries) give each query's scalar
    /// bits, also when the running max keeps growing (scores rising with position) and with
    /// scores of -inf and NaN.
    #[test]
    fn eight_queries_across_lanes_match_each_alone_bitwise() {
        for (n, d, rising) in [
            (45, 128, false),
            (70, 64, true),
            (19, 48, true),
            (8, 64, false),
        ] {
            let (_, mut k, v) = setup(n, d);
            if rising {
                for (j, row) in k.chunks_exact_mut(d).enumerate() {
                    for x in row.iter_mut() {
                        *x = f16::from_f32(x.to_f32() * (1.0 + j as f32 * 0.3));
                    }
                }
            }
            let mut seed = 5;
            let mut rows: Vec<f32> = (0..19 * d).map(|_| lcg(&mut seed) * 0.5).collect();
            // Query 9 scores NaN on every key, query 10 -inf.
            rows[9 * d] = f32::NAN;
            rows[10 * d] = f32::INFINITY;
            let (mut kf, mut vf) = (vec![0f32; n * d], vec![0f32; n * d]);
            k.convert_to_f32_slice(&mut kf);
            v.convert_to_f32_slice(&mut vf);
            let mut many: Vec<State> = (0..19).map(|_| State::new(d)).collect();
            // In two calls, so that states carry over between them.
            let half = n / 2;
            simd::attend_many(&mut many, &rows, simd::Kv::F32(&kf, &vf), half);
            simd::attend_many(
                &mut many,
                &rows,
                simd::Kv::F32(&kf[half * d..], &vf[half * d..]),
                n - half,
            );
            for (i, st) in many.iter().enumerate() {
                let mut alone = State::new(d);
                attend_impl(&mut alone, &rows[i * d..(i + 1) * d], &k, &v, n);
                let (a, b) = (st.finish(), alone.finish());
                let bits = |p: &Partial| {
                    let mut v: Vec<u32> = p.out.iter().map(|x| x.to_bits()).collect();
                    v.push(p.lse.to_bits());
                    v
                };
                assert_eq!(bits(&a), bits(&b), "n {n}, head size {d}, query {i}");
            }
        }
    }

    /// Many queries on one key range (a shared prefix: on AVX-512, sixteen lanes over the
    /// whole range with f16 converted per block) and on causal ranges (f32 tiles that all,
    /// then some, queries see) give each query's scalar bits, with rising scores, NaN and
    /// infinite queries, every head size path.
    #[test]
    fn many_queries_on_shared_and_causal_ranges_match_each_alone_bitwise() {
        for (n, d, rising) in [
            (150, 64, true),
            (70, 128, false),
            (40, 48, true),
            (33, 256, false),
        ] {
            let (_, mut k, v) = setup(n, d);
            if rising {
                for (j, row) in k.chunks_exact_mut(d).enumerate() {
                    for x in row.iter_mut() {
                        *x = f16::from_f32(x.to_f32() * (1.0 + j as f32 * 0.05));
                    }
                }
            }
            let queries = 35;
            let mut seed = 13;
            let mut rows: Vec<f32> = (0..queries * d).map(|_| lcg(&mut seed) * 0.5).collect();
            rows[9 * d] = f32::NAN;
            rows[10 * d] = f32::INFINITY;
            rows[20 * d + 1] = f32::NEG_INFINITY;
            let shared = vec![(0, n); queries];
            let causal: Vec<(usize, usize)> = (0..queries)
                .map(|i| (i / 20 * (i % 3), (n / 2 + i).min(n)))
                .collect();
            for ranges in [shared, causal] {
                let mut states: Vec<State> = (0..queries).map(|_| State::new(d)).collect();
                attend_shared(&mut states, &rows, &k, &v, &ranges);
                for (i, (st, &(lo, hi))) in states.iter().zip(&ranges).enumerate() {
                    let mut alone = State::new(d);
                    let r = &rows[i * d..(i + 1) * d];
                    attend_impl(&mut alone, r, &k[lo * d..], &v[lo * d..], hi - lo);
                    let bits = |p: &Partial| {
                        let mut v: Vec<u32> = p.out.iter().map(|x| x.to_bits()).collect();
                        v.push(p.lse.to_bits());
                        v
                    };
                    assert_eq!(
                        bits(&st.finish()),
                        bits(&alone.finish()),
                        "n {n}, head size {d}, query {i}, range {lo}..{hi}"
                    );
                }
            }
        }
    }

    /// One to fifteen queries on the same keys (AVX-512: `attend_few`'s blocks of sixteen
    /// keys, a short last block, every head size path; f16 and f32 keys; the state carried
    /// across two calls) give each query's scalar bits, also with rising scores (the max
    /// grows inside blocks) and NaN or infinite queries.
    #[test]
    fn few_queries_match_each_alone_bitwise() {
        for (n, d, rising) in [
            (1, 64, false),
            (16, 64, true),
            (53, 64, true),
            (40, 128, false),
            (35, 256, true),
            (21, 48, false),
        ] {
            let (_, mut k, v) = setup(n, d);
            if rising {
                for (j, row) in k.chunks_exact_mut(d).enumerate() {
                    for x in row.iter_mut() {
                        *x = f16::from_f32(x.to_f32() * (1.0 + j as f32 * 0.2));
                    }
                }
            }
            let (mut kf, mut vf) = (vec![0f32; n * d], vec![0f32; n * d]);
            k.convert_to_f32_slice(&mut kf);
            v.convert_to_f32_slice(&mut vf);
            for g in 1..=15 {
                let mut seed = 17 + g as u64;
                let mut rows: Vec<f32> = (0..g * d).map(|_| lcg(&mut seed) * 0.5).collect();
                if g > 5 {
                    rows[4 * d] = f32::NAN;
                    rows[5 * d + 2] = f32::INFINITY;
                }
                let cut = n / 3;
                let mut f32s: Vec<State> = (0..g).map(|_| State::new(d)).collect();
                let mut f16s = f32s.clone();
                for (lo, hi) in [(0, cut), (cut, n)] {
                    let (kl, vl) = (&kf[lo * d..hi * d], &vf[lo * d..hi * d]);
                    simd::attend_many(&mut f32s, &rows, simd::Kv::F32(kl, vl), hi - lo);
                    let (kl, vl) = (&k[lo * d..hi * d], &v[lo * d..hi * d]);
                    simd::attend_many(&mut f16s, &rows, simd::Kv::F16(kl, vl), hi - lo);
                }
                for i in 0..g {
                    let mut alone = State::new(d);
                    attend_impl(&mut alone, &rows[i * d..(i + 1) * d], &k, &v, n);
                    let want = alone.finish();
                    let at = format!("n {n}, head size {d}, {g} queries, query {i}");
                    for (kind, st) in [("f32", &f32s[i]), ("f16", &f16s[i])] {
                        let got = st.finish();
                        let same = got.lse.to_bits() == want.lse.to_bits()
                            && got
                                .out
                                .iter()
                                .zip(&want.out)
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{kind}, {at}: {got:?} vs {want:?}");
                    }
                }
            }
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
        attend_batch(&q, &views([&prefix; 3]), n_head, d, None, &mut shared);
        let mut copies = vec![0f32; q.len()];
        attend_batch(
            &q,
            &views([&prefix, &copy, &prefix]),
            n_head,
            d,
            None,
            &mut copies,
        );
        assert_eq!(shared, copies);
        let w = n_head * d;
        let mut r0 = 0;
        for (i, v) in views([&prefix; 3]).into_iter().enumerate() {
            let r1 = r0 + rows[i];
            let mut alone = vec![0f32; rows[i] * w];
            attend_batch(&q[r0 * w..r1 * w], &[v], n_head, d, None, &mut alone);
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

    /// Views on two prefixes and on none, interleaved in one batch (the groups of a prefix
    /// gather its views wherever they stand), give each view bitwise what it gets alone.
    #[test]
    fn views_on_several_prefixes_and_none_match_each_alone_bitwise() {
        let (n_head, n_kv, d) = (6, 3, 64);
        let mut seed = 23;
        let (a, b) = (layer(70, n_kv, d, &mut seed), layer(33, n_kv, d, &mut seed));
        let prefixes = [Some(&a), None, Some(&b), Some(&a), None, Some(&b), Some(&a)];
        let rows = [1, 2, 1, 3, 1, 1, 2];
        let privs: Vec<LayerKv> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| layer(r + 4 * i, n_kv, d, &mut seed))
            .collect();
        let views: Vec<KvView> = (0..rows.len())
            .map(|i| KvView {
                prefix: prefixes[i],
                private: &privs[i],
                rows: rows[i],
            })
            .collect();
        let w = n_head * d;
        let total: usize = rows.iter().sum();
        let q: Vec<f32> = (0..total * w).map(|_| lcg(&mut seed)).collect();
        let mut all = vec![0f32; q.len()];
        attend_batch(&q, &views, n_head, d, None, &mut all);
        let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
        let mut r0 = 0;
        for (i, v) in views.iter().enumerate() {
            let r1 = r0 + rows[i];
            let one = KvView {
                prefix: v.prefix,
                private: v.private,
                rows: v.rows,
            };
            let mut alone = vec![0f32; rows[i] * w];
            attend_batch(&q[r0 * w..r1 * w], &[one], n_head, d, None, &mut alone);
            assert_eq!(bits(&all[r0 * w..r1 * w]), bits(&alone), "view {i}");
            r0 = r1;
        }
    }

    /// Whether two partials are the same bits, output and log-sum-exp.
    fn same_bits(a: &Partial, b: &Partial) -> bool {
        a.lse.to_bits() == b.lse.to_bits()
            && a.out.len() == b.out.len()
            && a.out
                .iter()
                .zip(&b.out)
                .all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// A large decode batch on one prefix (tasks of several sixteens, each block of keys
    /// converted once for all of them on AVX-512) gives each sequence bitwise what it gets
    /// alone; and every sixteens-per-call count of the shared-range kernel gives each query
    /// its scalar bits, at every head size.
    #[test]
    fn several_sixteens_per_task_match_each_alone_bitwise() {
        let (n_head, n_kv, d) = (6, 2, 64);
        let mut seed = 29;
        let prefix = layer(70, n_kv, d, &mut seed);
        // 24 sequences x 3 heads per KV head: groups of 72 queries, cut in sixteens.
        let privs: Vec<LayerKv> = (0..24)
            .map(|i| layer(1 + i % 5, n_kv, d, &mut seed))
            .collect();
        let q: Vec<f32> = (0..24 * n_head * d).map(|_| lcg(&mut seed)).collect();
        let views: Vec<KvView> = privs
            .iter()
            .map(|p| KvView {
                prefix: Some(&prefix),
                private: p,
                rows: 1,
            })
            .collect();
        let mut all = vec![0f32; q.len()];
        attend_batch(&q, &views, n_head, d, None, &mut all);
        let w = n_head * d;
        for (i, p) in privs.iter().enumerate() {
            let v = KvView {
                prefix: Some(&prefix),
                private: p,
                rows: 1,
            };
            let mut alone = vec![0f32; w];
            attend_batch(&q[i * w..(i + 1) * w], &[v], n_head, d, None, &mut alone);
            let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[i * w..(i + 1) * w]), bits(&alone), "sequence {i}");
        }
        for (n, d, queries) in [(90, 64, 53), (45, 128, 40), (20, 256, 33), (37, 48, 49)] {
            let (_, k, v) = setup(n, d);
            let mut seed = 31;
            let rows: Vec<f32> = (0..queries * d).map(|_| lcg(&mut seed) * 0.7).collect();
            let mut states: Vec<State> = (0..queries).map(|_| State::new(d)).collect();
            attend_shared(&mut states, &rows, &k, &v, &vec![(0, n); queries]);
            for (i, st) in states.iter().enumerate() {
                let mut alone = State::new(d);
                attend_impl(&mut alone, &rows[i * d..(i + 1) * d], &k, &v, n);
                assert!(
                    same_bits(&st.finish(), &alone.finish()),
                    "head size {d}, {queries} queries, query {i}"
                );
            }
        }
    }

    /// A prefill chunk's queries (a few heads per row, each row one key further, a window's
    /// first key rising with it): the span all the leading sixteens see goes in one pass,
    /// each query's keys before and after it by tiles, and every query keeps its scalar bits.
    #[test]
    fn a_causal_chunk_split_around_the_common_span_matches_each_alone_bitwise() {
        for (n, d, heads, window) in [
            (150, 64, 3, None),
            (150, 64, 3, Some(40)),
            (90, 256, 4, Some(70)),
            (70, 128, 2, None),
        ] {
            let (_, k, v) = setup(n, d);
            let rows_in_chunk = 21;
            let queries = rows_in_chunk * heads;
            let mut seed = 37;
            let rows: Vec<f32> = (0..queries * d).map(|_| lcg(&mut seed) * 0.6).collect();
            // Row `t` of the chunk sits at position `n - rows_in_chunk + t`.
            let ranges: Vec<(usize, usize)> = (0..queries)
                .map(|i| {
                    let hi = n - rows_in_chunk + i / heads + 1;
                    (window.map_or(0, |w| hi.saturating_sub(w)), hi)
                })
                .collect();
            let mut states: Vec<State> = (0..queries).map(|_| State::new(d)).collect();
            attend_shared(&mut states, &rows, &k, &v, &ranges);
            for (i, (st, &(lo, hi))) in states.iter().zip(&ranges).enumerate() {
                let mut alone = State::new(d);
                let r = &rows[i * d..(i + 1) * d];
                attend_impl(&mut alone, r, &k[lo * d..], &v[lo * d..], hi - lo);
                assert!(
                    same_bits(&st.finish(), &alone.finish()),
                    "head size {d}, window {window:?}, query {i}, keys {lo}..{hi}"
                );
            }
        }
    }

    /// A sliding window: a prefix cut to the window gives bitwise what the whole prefix gives,
    /// batched or alone, and one-shot (all keys private) gives the same bits again; each query
    /// sees exactly the keys of its last `w` positions.
    #[test]
    fn sliding_window_is_exact_under_cut_batching_and_split() {
        let (n_head, n_kv, d, w) = (4, 1, 256, 40);
        let mut seed = 5;
        let prefix = layer(100, n_kv, d, &mut seed);
        let cut = prefix.cut_before(100 - (w - 1));
        assert_eq!((cut.start(), cut.len(), cut.end()), (61, 39, 100));
        let privs = [layer(3, n_kv, d, &mut seed), layer(50, n_kv, d, &mut seed)];
        let rows = [1, 7];
        let total: usize = rows.iter().sum();
        let q: Vec<f32> = (0..total * n_head * d).map(|_| lcg(&mut seed)).collect();
        let run_with = |pre: &LayerKv| {
            let views: Vec<KvView> = (0..2)
                .map(|i| KvView {
                    prefix: Some(pre),
                    private: &privs[i],
                    rows: rows[i],
                })
                .collect();
            let mut out = vec![0f32; q.len()];
            attend_batch(&q, &views, n_head, d, Some(w), &mut out);
            out
        };
        let whole = run_with(&prefix);
        assert_eq!(whole, run_with(&cut), "cut prefix changes the bits");
        // The second sequence alone and as one private segment (no prefix).
        let width = n_head * d;
        let (r0, r1) = (rows[0], total);
        let mut joined = prefix.clone();
        joined.append(&privs[1].key_rows(), &privs[1].value_rows(), privs[1].len());
        let mut one_shot = vec![0f32; (r1 - r0) * width];
        let view = KvView {
            prefix: None,
            private: &joined,
            rows: rows[1],
        };
        attend_batch(&q[r0 * width..], &[view], n_head, d, Some(w), &mut one_shot);
        assert_eq!(&whole[r0 * width..], &one_shot[..], "split != one-shot");
        // Reference: the last query of sequence 1, head 2, over its window's keys only.
        let t = rows[1] - 1;
        let p = 100 + privs[1].len() - rows[1] + t;
        let at = (r0 + t) * width + 2 * d;
        let scale = 1.0 / (d as f32).sqrt();
        let qs: Vec<f32> = q[at..at + d].iter().map(|x| x * scale).collect();
        let lo = p + 1 - w;
        let k = &joined.keys(0)[lo * d..(p + 1) * d];
        let v = &joined.values(0)[lo * d..(p + 1) * d];
        let want = reference(&qs, k, v, w, d);
        for (a, b) in whole[at..at + d].iter().zip(&want) {
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
