//! Sixteens of queries on the same keys with AVX-512, one query per lane throughout: scores,
//! softmax bookkeeping and value sums are all vertical operations, with no reduction shuffles
//! and no branch per query. Each lane does the scalar path's operations in its order
//! (`fold_scalar`): the score is `dot`'s 16 lane sums added by its fixed tree, a key raises the
//! max when `s > m`, each value is added as `acc + p * v`, and nothing is fused. So every
//! output keeps the scalar bits.

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use crate::attention::{State, MAX_HEAD_DIM};
use crate::kernels::x86::exp::exp_neg16;

/// Queries per call, one per lane.
pub(in crate::attention) const LANES: usize = 16;
/// Keys scored, then folded, per block at most: 64-wide heads take 32 (half the passes over
/// the transposed outputs), wider ones 16, so that the block, the queries and the outputs
/// stay within L1.
const BLOCK: usize = 32;

/// Element `t` of sixteen query (or output) rows at `t * LANES`, one aligned vector each; or
/// a block of keys or values converted to f32.
#[repr(C, align(64))]
struct Columns([f32; MAX_HEAD_DIM * LANES]);

/// Lane sum `i` of `dot(q, k)` for `KB` keys, sixteen queries: the product of elements `i`,
/// then those of `i + 16`, ... added in order, as the scalar `dot` does in its lane `i`.
#[inline(always)]
unsafe fn lane<const KB: usize>(
    qt: *const f32,
    k: &[*const f32; KB],
    i: usize,
    chunks: usize,
) -> [__m512; KB] {
    let q = _mm512_load_ps(qt.add(i * LANES));
    let mut a = [_mm512_setzero_ps(); KB];
    for x in 0..KB {
        a[x] = _mm512_mul_ps(q, _mm512_set1_ps(*k[x].add(i)));
    }
    for c in 1..chunks {
        let t = 16 * c + i;
        let q = _mm512_load_ps(qt.add(t * LANES));
        for x in 0..KB {
            a[x] = _mm512_add_ps(a[x], _mm512_mul_ps(q, _mm512_set1_ps(*k[x].add(t))));
        }
    }
    a
}

#[inline(always)]
unsafe fn add<const KB: usize>(a: [__m512; KB], b: [__m512; KB]) -> [__m512; KB] {
    let mut r = a;
    for x in 0..KB {
        r[x] = _mm512_add_ps(a[x], b[x]);
    }
    r
}

/// `dot`'s tree: lane sums `i + 8` into `i`, then `+ 4`, `+ 2`, `+ 1`.
#[inline(always)]
unsafe fn half<const KB: usize>(
    qt: *const f32,
    k: &[*const f32; KB],
    i: usize,
    c: usize,
) -> [__m512; KB] {
    add(lane(qt, k, i, c), lane(qt, k, i + 8, c))
}

#[inline(always)]
unsafe fn quarter<const KB: usize>(
    qt: *const f32,
    k: &[*const f32; KB],
    i: usize,
    c: usize,
) -> [__m512; KB] {
    add(half(qt, k, i, c), half(qt, k, i + 4, c))
}

#[inline(always)]
unsafe fn eighth<const KB: usize>(
    qt: *const f32,
    k: &[*const f32; KB],
    i: usize,
    c: usize,
) -> [__m512; KB] {
    add(quarter(qt, k, i, c), quarter(qt, k, i + 2, c))
}

/// The scores of `KB` keys, lane = query.
#[inline(always)]
unsafe fn scores<const KB: usize>(
    qt: *const f32,
    k: &[*const f32; KB],
    chunks: usize,
) -> [__m512; KB] {
    add(eighth(qt, k, 0, chunks), eighth(qt, k, 1, chunks))
}

/// `n` f16 values at `src` to f32 at `dst` (aligned); `n` a multiple of 16.
#[inline(always)]
pub(in crate::attention) unsafe fn widen(src: *const u8, dst: *mut f32, n: usize) {
    for i in (0..n).step_by(16) {
        let h = _mm256_loadu_si256((src as *const u16).add(i) as *const __m256i);
        _mm512_store_ps(dst.add(i), _mm512_cvtph_ps(h));
    }
}

/// Keys and values `j0..` (`len` floats each) as f32: f16 (`H`) widened into `kbuf` and
/// `vbuf`, f32 read in place.
#[inline(always)]
pub(in crate::attention) unsafe fn block_rows<const H: bool>(
    keys: *const u8,
    values: *const u8,
    j0: usize,
    len: usize,
    d: usize,
    kbuf: *mut f32,
    vbuf: *mut f32,
) -> (*const f32, *const f32) {
    if H {
        widen(keys.add(2 * j0 * d), kbuf, len);
        widen(values.add(2 * j0 * d), vbuf, len);
        (kbuf as *const f32, vbuf as *const f32)
    } else {
        let (k, v) = (keys as *const f32, values as *const f32);
        (k.add(j0 * d), v.add(j0 * d))
    }
}

/// Most sixteens of queries per call: each block of keys is converted from f16 once for all
/// of them (a sixth of `attend16`'s time when each sixteen converted its own).
pub(in crate::attention) const MAX_SETS: usize = 3;

/// How many sixteens a call takes at head size `d`: their transposed queries and
/// accumulators and one block of keys and values stay within L1.
pub(in crate::attention) fn sets_for(d: usize) -> usize {
    if d <= 64 {
        MAX_SETS
    } else if d <= 128 {
        2
    } else {
        1
    }
}

/// Sixteens of `states` (rows of `rows`, pre-scaled queries; `states.len()` a multiple of 16,
/// at most `sets_for(d)` of them) consume `n` keys and values: f16 (`H`, converted a block at a
/// time here, once for every sixteen) or f32. `D` is the head size when known at compile time
/// (0: the state's). Each sixteen does the whole block (scores, softmax, values) in turn.
///
/// # Safety
/// AVX-512 F present; `keys` and `values` hold `n` rows of the states' head size, a multiple
/// of 16; a row per state.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::needless_range_loop)]
pub(in crate::attention) unsafe fn attend16<const D: usize, const H: bool>(
    states: &mut [State],
    rows: &[f32],
    keys: *const u8,
    values: *const u8,
    n: usize,
) {
    let d = if D == 0 { states[0].dim } else { D };
    let sets = states.len() / LANES;
    assert!(
        (1..=sets_for(d)).contains(&sets) && states.len() == sets * LANES,
        "attend16 takes 1 to {} sixteens, not {} states",
        sets_for(d),
        states.len()
    );
    assert!(rows.len() >= states.len() * d, "a row per state");
    let (mut kbuf, mut vbuf) = (
        MaybeUninit::<Columns>::uninit(),
        MaybeUninit::<Columns>::uninit(),
    );
    let (kbuf, vbuf) = (kbuf.as_mut_ptr() as *mut f32, vbuf.as_mut_ptr() as *mut f32);
    // Set `x`'s transposed queries and accumulators at `x * d * LANES`.
    let (mut qt, mut acc) = (
        MaybeUninit::<[Columns; MAX_SETS]>::uninit(),
        MaybeUninit::<[Columns; MAX_SETS]>::uninit(),
    );
    let (qt0, acc0) = (qt.as_mut_ptr() as *mut f32, acc.as_mut_ptr() as *mut f32);
    for (i, st) in states.iter().enumerate() {
        let base = i / LANES * d * LANES + i % LANES;
        for t in 0..d {
            *qt0.add(base + t * LANES) = rows[i * d + t];
            *acc0.add(base + t * LANES) = st.acc[t];
        }
    }
    let mut ms = [_mm512_setzero_ps(); MAX_SETS];
    let mut ls = [_mm512_setzero_ps(); MAX_SETS];
    for x in 0..sets {
        let set = &states[x * LANES..(x + 1) * LANES];
        ms[x] = _mm512_loadu_ps(std::array::from_fn::<f32, 16, _>(|i| set[i].m).as_ptr());
        ls[x] = _mm512_loadu_ps(std::array::from_fn::<f32, 16, _>(|i| set[i].l).as_ptr());
    }
    let one = _mm512_set1_ps(1.0);
    let chunks = d / 16;
    // A block's scores and weights, made once per call: zeroed per block they were a 4 KB
    // memset per 32 keys. Entries `..nb` are written before they are read; `c[j]` only
    // where `grew[j]`.
    let mut s = [_mm512_setzero_ps(); BLOCK];
    let mut p = [_mm512_setzero_ps(); BLOCK];
    let mut c = [one; BLOCK];
    let mut grew = [0 as __mmask16; BLOCK];
    let mut j0 = 0;
    while j0 < n {
        let nb = if d <= 64 { BLOCK } else { 16 }.min(n - j0);
        let (keys, values) = block_rows::<H>(keys, values, j0, nb * d, d, kbuf, vbuf);
        let key = |j: usize| keys.add(j * d);
        for x in 0..sets {
            let (qt, acc) = (qt0.add(x * d * LANES), acc0.add(x * d * LANES));
            let (mut m, mut l) = (ms[x], ls[x]);
            let mut j = 0;
            while j + 4 <= nb {
                let sc = scores::<4>(qt, &[key(j), key(j + 1), key(j + 2), key(j + 3)], chunks);
                s[j..j + 4].copy_from_slice(&sc);
                j += 4;
            }
            while j < nb {
                s[j] = scores::<1>(qt, &[key(j)], chunks)[0];
                j += 1;
            }
            // Key by key, every lane: `if s > m { l *= c; acc *= c; m = s }`, then `l += p`.
            // Lanes that do not grow multiply by exactly 1.
            for j in 0..nb {
                let up = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(s[j], m);
                grew[j] = up;
                if up != 0 {
                    c[j] = _mm512_mask_blend_ps(up, one, exp_neg16(_mm512_sub_ps(m, s[j])));
                    l = _mm512_mul_ps(l, c[j]);
                    m = _mm512_mask_blend_ps(up, m, s[j]);
                }
                p[j] = exp_neg16(_mm512_sub_ps(s[j], m));
                l = _mm512_add_ps(l, p[j]);
            }
            (ms[x], ls[x]) = (m, l);
            // Values: sixteen output elements of every query in registers per pass.
            for o in (0..d).step_by(16) {
                let mut a = [_mm512_setzero_ps(); 16];
                for t in 0..16 {
                    a[t] = _mm512_load_ps(acc.add((o + t) * LANES));
                }
                for j in 0..nb {
                    if grew[j] != 0 {
                        for y in a.iter_mut() {
                            *y = _mm512_mul_ps(*y, c[j]);
                        }
                    }
                    let v = values.add(j * d + o);
                    for t in 0..16 {
                        a[t] = _mm512_add_ps(a[t], _mm512_mul_ps(p[j], _mm512_set1_ps(*v.add(t))));
                    }
                }
                for t in 0..16 {
                    _mm512_store_ps(acc.add((o + t) * LANES), a[t]);
                }
            }
        }
        j0 += nb;
    }
    for x in 0..sets {
        let (mut mv, mut lv) = ([0f32; 16], [0f32; 16]);
        _mm512_storeu_ps(mv.as_mut_ptr(), ms[x]);
        _mm512_storeu_ps(lv.as_mut_ptr(), ls[x]);
        for i in 0..LANES {
            let st = &mut states[x * LANES + i];
            st.m = mv[i];
            st.l = lv[i];
            let base = x * d * LANES + i;
            for t in 0..d {
                st.acc[t] = *acc0.add(base + t * LANES);
            }
        }
    }
}
