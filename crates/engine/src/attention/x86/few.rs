//! One to fifteen queries on the same keys with AVX-512: the heads of one KV group of a lone
//! sequence (batch-1 decode, a view's private keys, per-request prefix copies). Too few to fill
//! `attend16`'s lanes, so each query takes a block of sixteen keys on its own, in three layouts:
//!
//! - scores, lane = `dot` lane: each key's sixteen lane sums in one vector, the sixteen keys
//!   then reduced together by `dot`'s tree (`+8`, `+4`, `+2`, `+1`) through shuffles. Each
//!   f16 chunk of a key is converted in a register once for up to four queries, rather than
//!   widened into a block buffer and read back by each query;
//! - softmax, lane = key: the running max as a scan (`if s > m` key by key), then `l` key by
//!   key in order;
//! - values, lane = output element: the accumulator stays in registers through the block;
//!   converted in registers when one pass takes every query, else widened once for all.
//!
//! Every operation is the scalar path's (`fold_scalar`), in its order, with nothing fused, so
//! every output keeps the scalar bits.

// Key, chunk and query indices are the layout; index loops say it most plainly.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::wide::widen;
use crate::attention::{State, MAX_HEAD_DIM};
use crate::kernels::x86::exp::exp_neg16;

/// Keys per block: one vector of scores.
const BLOCK: usize = 16;
/// Vectors in the longest head.
const CHUNKS: usize = MAX_HEAD_DIM / 16;

/// A block of keys or values converted to f32.
#[repr(C, align(64))]
struct Rows([f32; BLOCK * MAX_HEAD_DIM]);

/// One step of `dot`'s tree for two vectors: `lo + hi` of the shuffles `LO` and `HI` (the
/// lower lanes first, as the scalar `lanes[i] += lanes[i + w]`), whole 128-bit lanes moved
/// (`LANES`) or elements within each.
#[inline(always)]
unsafe fn fold<const LO: i32, const HI: i32, const LANES: bool>(a: __m512, b: __m512) -> __m512 {
    if LANES {
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<LO>(a, b),
            _mm512_shuffle_f32x4::<HI>(a, b),
        )
    } else {
        _mm512_add_ps(_mm512_shuffle_ps::<LO>(a, b), _mm512_shuffle_ps::<HI>(a, b))
    }
}

/// `+8` for keys `a` and `b`: a's eight sums in the low half, b's in the high.
#[inline(always)]
unsafe fn step8(a: __m512, b: __m512) -> __m512 {
    fold::<0x44, 0xEE, true>(a, b)
}

/// `+4` for four keys (two `step8` results): key `k`'s four sums in 128-bit lane `k`.
#[inline(always)]
unsafe fn step4(ab: __m512, cd: __m512) -> __m512 {
    fold::<0x88, 0xDD, true>(ab, cd)
}

/// `+2` within each 128-bit lane: `[x0 + x2, x1 + x3]` of `w` then of `u`.
#[inline(always)]
unsafe fn step2(w: __m512, u: __m512) -> __m512 {
    fold::<0x44, 0xEE, false>(w, u)
}

/// `+1` within each 128-bit lane.
#[inline(always)]
unsafe fn step1(v: __m512, u: __m512) -> __m512 {
    fold::<0x88, 0xDD, false>(v, u)
}

/// Sixteen floats of a key at element `at`: converted from f16 (`H`) or read as f32.
#[inline(always)]
unsafe fn key<const H: bool>(k: *const u8, at: usize) -> __m512 {
    if H {
        _mm512_cvtph_ps(_mm256_loadu_si256(
            (k as *const u16).add(at) as *const __m256i
        ))
    } else {
        _mm512_loadu_ps((k as *const f32).add(at))
    }
}

/// Lane sums of `dot(q, k)` for `G` queries (rows of `q`) and the key at row `j`: each chunk
/// of the key is converted once for all of them.
#[inline(always)]
unsafe fn lanes<const G: usize, const H: bool>(
    q: *const f32,
    k: *const u8,
    j: usize,
    d: usize,
) -> [__m512; G] {
    let kc = key::<H>(k, j * d);
    let mut a = [_mm512_setzero_ps(); G];
    for x in 0..G {
        a[x] = _mm512_mul_ps(_mm512_loadu_ps(q.add(x * d)), kc);
    }
    for c in 1..d / 16 {
        let kc = key::<H>(k, j * d + 16 * c);
        for x in 0..G {
            let p = _mm512_mul_ps(_mm512_loadu_ps(q.add(x * d + 16 * c)), kc);
            a[x] = _mm512_add_ps(a[x], p);
        }
    }
    a
}

/// `G` queries' lane sums for keys `j` and `j + 1` through the `+8` step.
#[inline(always)]
unsafe fn two<const G: usize, const H: bool>(
    q: *const f32,
    k: *const u8,
    j: usize,
    d: usize,
) -> [__m512; G] {
    let (mut a, b) = (lanes::<G, H>(q, k, j, d), lanes::<G, H>(q, k, j + 1, d));
    // Loops, not `from_fn`: a closure would not inherit the caller's target features (its
    // intrinsics would be calls).
    for x in 0..G {
        a[x] = step8(a[x], b[x]);
    }
    a
}

/// Four keys from `j`, reduced through the `+4` step, for `G` queries.
#[inline(always)]
unsafe fn four<const G: usize, const H: bool>(
    q: *const f32,
    k: *const u8,
    j: usize,
    d: usize,
) -> [__m512; G] {
    let mut ab = two::<G, H>(q, k, j, d);
    let cd = two::<G, H>(q, k, j + 2, d);
    for x in 0..G {
        ab[x] = step4(ab[x], cd[x]);
    }
    ab
}

/// The scores of `G` queries (rows of `q`) with the sixteen keys at `k` (lane = key), each by
/// `dot`'s lanes and tree.
#[inline(always)]
unsafe fn scores<const G: usize, const H: bool>(
    q: *const f32,
    k: *const u8,
    d: usize,
    out: &mut [__m512],
) {
    let (mut lo, b) = (four::<G, H>(q, k, 0, d), four::<G, H>(q, k, 4, d));
    for x in 0..G {
        lo[x] = step2(lo[x], b[x]);
    }
    let (a, b) = (four::<G, H>(q, k, 8, d), four::<G, H>(q, k, 12, d));
    // Element 4t + e now holds key 4e + t.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    for x in 0..G {
        let hi = step2(a[x], b[x]);
        out[x] = _mm512_permutexvar_ps(order, step1(lo[x], hi));
    }
}

/// Queries per scores pass at most.
const MOST: usize = 4;

/// Every query's scores for the block at `k`, at most four queries a pass.
#[inline(always)]
unsafe fn scores_all<const H: bool>(
    rows: *const f32,
    k: *const u8,
    g: usize,
    d: usize,
    s: &mut [__m512],
) {
    let size = g.div_ceil(g.div_ceil(MOST));
    let mut x = 0;
    while x < g {
        let (q, o) = (rows.add(x * d), &mut s[x..]);
        x += match size.min(g - x) {
            1 => {
                scores::<1, H>(q, k, d, o);
                1
            }
            2 => {
                scores::<2, H>(q, k, d, o);
                2
            }
            3 => {
                scores::<3, H>(q, k, d, o);
                3
            }
            _ => {
                scores::<4, H>(q, k, d, o);
                4
            }
        };
    }
}

/// Lanes moved up by `S` (lane `j` takes lane `j - S`), the low lanes -inf.
#[inline(always)]
unsafe fn shift_up<const S: i32>(x: __m512) -> __m512 {
    let low = _mm512_castps_si512(_mm512_set1_ps(f32::NEG_INFINITY));
    // `alignr`'s count is 16 - S; the const generic cannot be computed, so match.
    let x = _mm512_castps_si512(x);
    _mm512_castsi512_ps(match S {
        1 => _mm512_alignr_epi32::<15>(x, low),
        2 => _mm512_alignr_epi32::<14>(x, low),
        4 => _mm512_alignr_epi32::<12>(x, low),
        _ => _mm512_alignr_epi32::<8>(x, low),
    })
}

/// Most queries per call (one score vector each on the stack).
const MAX_QUERIES: usize = 16;

/// The softmax of one block for one query: what its values pass needs.
struct Weights {
    /// `exp(s - m)` per key, `m` the running max after the key.
    p: [f32; BLOCK],
    /// The factor each growing key rescales by (1 elsewhere).
    c: [f32; BLOCK],
    /// Keys that raised the max.
    grew: u16,
}

/// The running max and weights of one query's block (`s`, lane = key, `valid` the keys),
/// from its max `m` so far (in every lane); returns the max after the block, in every lane.
#[inline(always)]
unsafe fn softmax(s: __m512, valid: __mmask16, m: __m512, nb: usize, w: &mut Weights) -> __m512 {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    // The running max key by key: NaN scores never raise it (`s > m` is false) and lanes past
    // the block are not keys, so both scan as -inf. `max_ps(later, earlier)` keeps the
    // earlier value on ties, as the scalar loop does.
    let ord = _mm512_mask_cmp_ps_mask::<_CMP_ORD_Q>(valid, s, s);
    let mut x = _mm512_mask_mov_ps(neg_inf, ord, s);
    x = _mm512_max_ps(x, shift_up::<1>(x));
    x = _mm512_max_ps(x, shift_up::<2>(x));
    x = _mm512_max_ps(x, shift_up::<4>(x));
    x = _mm512_max_ps(x, shift_up::<8>(x));
    let after = _mm512_max_ps(x, m);
    let before = _mm512_max_ps(shift_up::<1>(x), m);
    w.grew = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(valid, s, before);
    _mm512_storeu_ps(w.p.as_mut_ptr(), exp_neg16(_mm512_sub_ps(s, after)));
    if w.grew != 0 {
        _mm512_storeu_ps(w.c.as_mut_ptr(), exp_neg16(_mm512_sub_ps(before, s)));
    }
    // The last key's max in every lane, kept in a register: read back from memory as a
    // scalar, it waited on a store that cannot forward (perf put a tenth of the samples at
    // three queries there; 3 % of the time).
    _mm512_permutexvar_ps(_mm512_set1_epi32(nb as i32 - 1), after)
}

/// Most queries whose `l` chains run interleaved: a query's sixteen dependent adds per block,
/// one query after another, were a tenth of `attend_few`'s time.
const SUMS: usize = 8;

/// `l[x]` (query `x` of `w`) takes its block's weights key by key: `l *= c` where the key
/// grew, then `l += p`. Key outer, query inner: the queries' chains overlap; each query's
/// operations and their order are the scalar loop's. `K` chains, one per query (they were
/// padded to eight: the dropped ones cost 5 % of a lone SmolLM2 row's attention).
#[inline(always)]
unsafe fn sum_weights<const K: usize>(l: &mut [f32], w: &[Weights], nb: usize) {
    let w: &[Weights; K] = w.try_into().expect("K weights");
    // Scalar `addss`: left to itself the compiler gathers each key's weights across the
    // queries into a vector, slower than the chains it overlaps.
    let mut v = [_mm_setzero_ps(); K];
    for x in 0..K {
        v[x] = _mm_set_ss(l[x]);
    }
    let grew = w.iter().any(|w| w.grew != 0);
    for j in 0..nb {
        for x in 0..K {
            if grew && w[x].grew >> j & 1 != 0 {
                v[x] = _mm_mul_ss(v[x], _mm_set_ss(w[x].c[j]));
            }
            v[x] = _mm_add_ss(v[x], _mm_set_ss(w[x].p[j]));
        }
    }
    for x in 0..K {
        l[x] = _mm_cvtss_f32(v[x]);
    }
}

/// `QG` queries' accumulators (`acc[q]`, `d` floats) take the block's values at `v` (f16 if
/// `H`, converted in registers), key by key: `acc *= c` where the key grew, then
/// `acc += p * v`. Their chains interleave.
#[inline(always)]
unsafe fn add_values<const QG: usize, const H: bool>(
    acc: [*mut f32; QG],
    w: [&Weights; QG],
    v: *const u8,
    nb: usize,
    d: usize,
) {
    let chunks = d / 16;
    let mut a = [[_mm512_setzero_ps(); CHUNKS]; QG];
    for q in 0..QG {
        for u in 0..chunks {
            a[q][u] = _mm512_loadu_ps(acc[q].add(16 * u));
        }
    }
    if w.iter().all(|w| w.grew == 0) {
        // No key raised a max (the common case past the first blocks): no checks.
        for j in 0..nb {
            for q in 0..QG {
                let pj = _mm512_set1_ps(w[q].p[j]);
                for u in 0..chunks {
                    let x = _mm512_mul_ps(pj, key::<H>(v, j * d + 16 * u));
                    a[q][u] = _mm512_add_ps(a[q][u], x);
                }
            }
        }
        for q in 0..QG {
            for u in 0..chunks {
                _mm512_storeu_ps(acc[q].add(16 * u), a[q][u]);
            }
        }
        return;
    }
    for j in 0..nb {
        for q in 0..QG {
            if w[q].grew >> j & 1 != 0 {
                let cj = _mm512_set1_ps(w[q].c[j]);
                for u in 0..chunks {
                    a[q][u] = _mm512_mul_ps(a[q][u], cj);
                }
            }
            let pj = _mm512_set1_ps(w[q].p[j]);
            for u in 0..chunks {
                a[q][u] = _mm512_add_ps(a[q][u], _mm512_mul_ps(pj, key::<H>(v, j * d + 16 * u)));
            }
        }
    }
    for q in 0..QG {
        for u in 0..chunks {
            _mm512_storeu_ps(acc[q].add(16 * u), a[q][u]);
        }
    }
}

/// Every query's scores for the block of keys from `j0`: a short last block's keys widened
/// into `kbuf` and padded with zeros (their lanes are masked off later), so that scores
/// always take sixteen keys.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_scores<const H: bool>(
    rows: *const f32,
    keys: *const u8,
    kbuf: *mut f32,
    j0: usize,
    n: usize,
    g: usize,
    d: usize,
    s: &mut [__m512],
) {
    let nb = BLOCK.min(n - j0);
    let kp = keys.add(if H { 2 } else { 4 } * j0 * d);
    if nb == BLOCK {
        return scores_all::<H>(rows, kp, g, d, s);
    }
    if H {
        widen(kp, kbuf, nb * d);
    } else {
        std::ptr::copy_nonoverlapping(kp as *const f32, kbuf, nb * d);
    }
    std::ptr::write_bytes(kbuf.add(nb * d), 0, (BLOCK - nb) * d);
    scores_all::<false>(rows, kbuf as *const u8, g, d, s);
}

/// Up to `MAX_QUERIES` states (rows of `rows`, pre-scaled queries) consume `n` keys and
/// values: f16 (`H`, converted as they are read) or f32. `D` is the head size when known at
/// compile time (0: the state's). Per block: every query's scores, then every query's
/// softmax, then the values for a few queries at a time, so independent chains overlap.
///
/// # Safety
/// AVX-512 F present; `keys` and `values` hold `n` rows of the states' head size, a multiple
/// of 16; `rows` holds a row per state.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
pub(in crate::attention) unsafe fn attend_few<const D: usize, const H: bool>(
    states: &mut [State],
    rows: &[f32],
    keys: *const u8,
    values: *const u8,
    n: usize,
) {
    let Some(first) = states.first() else {
        return;
    };
    let g = states.len();
    assert!(g <= MAX_QUERIES, "{g} queries > {MAX_QUERIES}");
    let d = if D == 0 { first.dim } else { D };
    // Accumulators held in registers per values pass: 16 vectors.
    let qg = 256usize.checked_div(D).map_or(1, |x| x.clamp(1, 4));
    let (mut kbuf, mut vbuf) = (MaybeUninit::<Rows>::uninit(), MaybeUninit::<Rows>::uninit());
    let (kbuf, vbuf) = (kbuf.as_mut_ptr() as *mut f32, vbuf.as_mut_ptr() as *mut f32);
    let mut w: [Weights; MAX_QUERIES] = std::array::from_fn(|_| Weights {
        p: [0.0; BLOCK],
        c: [1.0; BLOCK],
        grew: 0,
    });
    let mut s = [_mm512_setzero_ps(); MAX_QUERIES];
    let mut m = [_mm512_setzero_ps(); MAX_QUERIES];
    for (m, st) in m.iter_mut().zip(states.iter()) {
        *m = _mm512_set1_ps(st.m);
    }
    let passes = g.div_ceil(qg);
    let mut j0 = 0;
    while j0 < n {
        let nb = BLOCK.min(n - j0);
        // The next block's keys and values on their way to L1: read from memory in the
        // compute loops, a long decode's KV streamed a tenth slower without.
        if j0 + BLOCK < n {
            let at = if H { 2 } else { 4 } * (j0 + BLOCK) * d;
            let bytes = if H { 2 } else { 4 } * BLOCK.min(n - j0 - BLOCK) * d;
            for o in (0..bytes).step_by(64) {
                _mm_prefetch::<_MM_HINT_T0>(keys.add(at + o) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(values.add(at + o) as *const i8);
            }
        }
        block_scores::<H>(rows.as_ptr(), keys, kbuf, j0, n, g, d, &mut s);
        let valid: __mmask16 = ((1u32 << nb) - 1) as __mmask16;
        for i in 0..g {
            m[i] = softmax(s[i], valid, m[i], nb, &mut w[i]);
        }
        // One pass over the values converts them in registers; more share a widened copy.
        let vp = values.add(if H { 2 } else { 4 } * j0 * d);
        if H && passes > 1 {
            widen(vp, vbuf, nb * d);
        }
        for i0 in (0..g).step_by(SUMS) {
            let k = SUMS.min(g - i0);
            let mut l = [0f32; SUMS];
            for x in 0..k {
                l[x] = states[i0 + x].l;
            }
            let w = &w[i0..i0 + k];
            match k {
                1 => sum_weights::<1>(&mut l, w, nb),
                2 => sum_weights::<2>(&mut l, w, nb),
                3 => sum_weights::<3>(&mut l, w, nb),
                4 => sum_weights::<4>(&mut l, w, nb),
                5 => sum_weights::<5>(&mut l, w, nb),
                6 => sum_weights::<6>(&mut l, w, nb),
                7 => sum_weights::<7>(&mut l, w, nb),
                _ => sum_weights::<8>(&mut l, w, nb),
            }
            for x in 0..k {
                states[i0 + x].l = l[x];
            }
        }
        let mut i = 0;
        while i < g {
            let k = g.div_ceil(passes).min(g - i);
            macro_rules! pass {
                ($q:expr, $h:expr, $v:expr) => {
                    add_values::<$q, $h>(
                        std::array::from_fn(|x| states[i + x].acc.as_mut_ptr()),
                        std::array::from_fn(|x| &w[i + x]),
                        $v,
                        nb,
                        d,
                    )
                };
            }
            match (k, H && passes > 1) {
                (4, false) => pass!(4, H, vp),
                (3, false) => pass!(3, H, vp),
                (2, false) => pass!(2, H, vp),
                (_, false) => pass!(1, H, vp),
                (4, true) => pass!(4, false, vbuf as *const u8),
                (3, true) => pass!(3, false, vbuf as *const u8),
                (2, true) => pass!(2, false, vbuf as *const u8),
                (_, true) => pass!(1, false, vbuf as *const u8),
            }
            i += k;
        }
        j0 += nb;
    }
    for (st, m) in states.iter_mut().zip(m) {
        st.m = _mm512_cvtss_f32(m);
    }
}
