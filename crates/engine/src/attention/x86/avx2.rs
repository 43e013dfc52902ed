//! The 256-bit attention kernels (AVX2, F16C): `attend_avx2` runs up to four queries in
//! lockstep over shared key and value rows, `attend8` eight queries across the lanes of a
//! shared f32 tile. The same arithmetic as the scalar reference (`scalar.rs`).

use crate::attention::State;
use crate::kernels::x86::exp::exp_neg8;

/// Eight dot-product vectors (key `j`'s 16 lanes already folded to 8 in `x[j]`) to the
/// eight scores, each by the scalar `dot`'s tree: `(l0 + l4) + (l2 + l6)` and
/// `(l1 + l5) + (l3 + l7)`, added. Transposing shuffles instead of one reduction per key.
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
#[target_feature(enable = "avx2,f16c")]
pub(in crate::attention) unsafe fn attend_avx2<const D: usize, const Q: usize, const H: bool>(
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
    // Every lane is written below (the ones past `nb` with zeros): zeroing the whole array
    // first was a 1 KB `memset` call per block of keys, ~4 % of a prefill's attention.
    let mut x = [[std::mem::MaybeUninit::<__m256>::uninit(); 8]; Q];
    for i in 0..Q {
        for v in &mut x[i][nb..] {
            v.write(_mm256_setzero_ps());
        }
    }
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
            x[i][jj].write(_mm256_add_ps(a0[i], a1[i]));
        }
    }
    // A loop, not `from_fn`: a closure would not inherit the caller's target features.
    let mut r = [_mm256_setzero_ps(); Q];
    for i in 0..Q {
        // SAFETY: lanes `..nb` were written in the key loop, the rest with zeros.
        r[i] = reduce8(&x[i].map(|v| v.assume_init()));
    }
    r
}

/// Eight vectors of eight to their transpose: row `i` lane `j` to row `j` lane `i`.
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
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::needless_range_loop)]
pub(in crate::attention) unsafe fn attend8<const D: usize>(
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
        // Query `i`'s vectors at `i * ob..`: `Q * ob` <= 8, the registers this pass uses (an
        // array of eight per query was a 1 KB `memset` per block at four queries).
        let mut a = [_mm256_setzero_ps(); 8];
        for i in 0..Q {
            for u in 0..ob {
                a[i * ob + u] = _mm256_loadu_ps(accs[i].add(8 * (o0 + u)));
            }
        }
        for jj in 0..nb {
            let vr = (j0 + jj) * d + 8 * o0;
            for i in 0..Q {
                if any && grew[i] >> jj & 1 != 0 {
                    let cv = _mm256_set1_ps(c[i][jj]);
                    for u in 0..ob {
                        a[i * ob + u] = _mm256_mul_ps(a[i * ob + u], cv);
                    }
                }
                let pv = _mm256_set1_ps(p[i][jj]);
                for u in 0..ob {
                    let v = load::<H>(values, vr + 8 * u);
                    a[i * ob + u] = _mm256_add_ps(a[i * ob + u], _mm256_mul_ps(pv, v));
                }
            }
        }
        for i in 0..Q {
            for u in 0..ob {
                _mm256_storeu_ps(accs[i].add(8 * (o0 + u)), a[i * ob + u]);
            }
        }
    }
}
