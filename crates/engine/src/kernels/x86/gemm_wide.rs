//! The GEMM on 512-bit vectors (AVX-512 F/BW/VL/VNNI): a tile is `P` pairs of adjacent
//! repacked groups (16 weight rows each, group `2p` in lanes 0..8 and `2p + 1` in lanes 8..16)
//! x up to 16 activation rows (q4_K and q5_K up to 8: more spill their per-row sums). Sixteen
//! rows unpack each block's weights once for twice the rows: 5-9 % faster than eight at batch
//! 32 and in prefill on the Xeon. With two pairs (32 weight rows) each broadcast activation
//! word feeds two `vpdpbusd`: 512-bit loads issue one per cycle where Intel's two ports run
//! two `vpdpbusd`, so one pair's tile waits on its loads. Every lane does what a lane of
//! `gemm.rs`'s VNNI tile does: the same exact i32 block dots (`vpdpbusd`), zero points, scales
//! and mins, and the same float terms added into lane `term % 8` and reduced by the same tree,
//! so every output has the portable path's bits. Where 512-bit operations issue whole (Intel's
//! two 512-bit ports), a block's dots take half the instructions and half the cycles of the
//! 256-bit tile.

// Lane and sub-block indices are the layout; index loops say it most plainly.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::gemm::{
    each_row, plane_chunks, prefetch_run, Tile, IQ4NL, IQ4XS, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0,
    Q5_1, Q6K, Q8_0,
};
use super::Line;
use crate::kernels::repack::ROWS;
use crate::kernels::{Format, IQ4, QK};

/// The tile over `t.group`, which holds two whole repacked groups back to back; `t.cols` (up
/// to 16) of its columns are stored.
///
/// # Safety
/// AVX2, F16C and AVX-512 F, BW, VL and VNNI present; `t.group` is two repacked groups of `t.f`
/// for `t.acts.nb` blocks; `t.out` has room for `t.mt` rows of `t.cols` columns at `t.ldo`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_pair(t: &Tile) {
    tile::<1>(t, std::ptr::null())
}

/// As `tile_pair` for a K format, its blocks' weights read from `planes` as `unpack_pair`
/// wrote them for `t.group`.
///
/// # Safety
/// As `tile_pair`; `planes` holds `unpack_pair`'s lines for `t.group`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_pair_planes(t: &Tile, planes: &[Line]) {
    assert!(t.f.is_k() && planes.len() >= 8 * t.acts.nb);
    tile::<1>(t, planes.as_ptr() as *const u8)
}

/// The unpacked weights of a pair of K-format groups (`group`, two groups back to back,
/// `nb` 32-blocks): per block the 8 vectors `weights` gives, one line each, so that the tiles
/// of a chunk's rows unpack each block once, not once per tile (q5_K's eight-row tiles spent
/// ~10 % of their time unpacking). `prefetch` as a tile's: the run ahead, for calls that
/// stream their weights.
///
/// # Safety
/// As `tile_pair`; `group` holds `nb` blocks of `f`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn unpack_pair(
    f: Format,
    group: &[u8],
    nb: usize,
    prefetch: bool,
    out: &mut [Line],
) {
    assert!(f.is_k() && out.len() >= 8 * nb);
    match f {
        Format::IQ4XS => unpack::<IQ4XS>(group, nb, prefetch, out),
        Format::Q3K => unpack::<Q3K>(group, nb, prefetch, out),
        Format::Q2K => unpack::<Q2K>(group, nb, prefetch, out),
        Format::Q4K => unpack::<Q4K>(group, nb, prefetch, out),
        Format::Q5K => unpack::<Q5K>(group, nb, prefetch, out),
        Format::Q6K => unpack::<Q6K>(group, nb, prefetch, out),
        Format::Q4_0
        | Format::Q4_1
        | Format::Q5_0
        | Format::Q5_1
        | Format::Q8_0
        | Format::IQ4NL => {
            unreachable!("{f:?} is not a K format")
        }
    }
}

#[inline(always)]
unsafe fn unpack<const F: u8>(group: &[u8], nb: usize, prefetch: bool, out: &mut [Line]) {
    let f = Format::of_code(F);
    let (bps, hb, pb, sb) = (
        f.blocks_per_super(),
        f.header_bytes(),
        f.plane_bytes(),
        f.super_bytes(),
    );
    let [(a, b)] = pair_ptrs::<1>(group);
    let dst = out.as_mut_ptr() as *mut __m512i;
    for blk in 0..nb {
        let (s, bi) = (blk / bps, blk % bps);
        if prefetch {
            let per = sb / bps;
            prefetch_run(
                group.as_ptr(),
                group.len(),
                2 * (s * sb + bi * per),
                2 * per,
            );
        }
        let at = s * sb + hb + bi * pb;
        let v = weights::<F>(a.add(at), b.add(at));
        for (j, vj) in v.iter().enumerate() {
            _mm512_store_si512(dst.add(8 * blk + j), *vj);
        }
    }
}

/// As `tile_pair` over four whole groups (`t.cols` up to 32).
///
/// # Safety
/// As `tile_pair`, with four groups in `t.group`.
#[target_feature(enable = "avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_quad(t: &Tile) {
    tile::<2>(t, std::ptr::null())
}

#[inline(always)]
unsafe fn tile<const P: usize>(t: &Tile, planes: *const u8) {
    let (f, mt) = (t.f, t.mt);
    macro_rules! go {
        ($kernel:ident, $c:expr, $p:expr) => {
            match mt {
                1 => $kernel::<$c, 1, $p>(t, planes),
                2 => $kernel::<$c, 2, $p>(t, planes),
                4 => $kernel::<$c, 4, $p>(t, planes),
                8 => $kernel::<$c, 8, $p>(t, planes),
                _ => unreachable!("a tile of {mt} rows"),
            }
        };
        // The 32-block tiles and q6_K's also take sixteen rows (`run_groups`).
        ($kernel:ident, $c:expr, $p:expr, 16) => {
            match mt {
                16 => $kernel::<$c, 16, $p>(t, planes),
                _ => go!($kernel, $c, $p),
            }
        };
    }
    let k_format = f.is_k();
    // The K formats run two-group tiles only (`run_groups`): their four-group tile measured
    // slower (16 weight vectors and each row's super-block sums outrun the registers).
    assert!(P == 1 || !k_format, "the K formats take two-group tiles");
    assert!(
        mt <= 8 || super::sixteen_rows(f),
        "{f:?} takes up to eight rows"
    );
    match f {
        Format::Q4_0 => go!(tile_n, Q4_0, P, 16),
        Format::Q4_1 => go!(tile_n, Q4_1, P, 16),
        Format::Q5_0 => go!(tile_n, Q5_0, P, 16),
        Format::Q5_1 => go!(tile_n, Q5_1, P, 16),
        Format::Q8_0 => go!(tile_n, Q8_0, P, 16),
        Format::IQ4NL => go!(tile_n, IQ4NL, P, 16),
        Format::IQ4XS => go!(tile_k, IQ4XS, 1),
        Format::Q3K => go!(tile_k, Q3K, 1, 16),
        Format::Q2K => go!(tile_k, Q2K, 1),
        Format::Q4K => go!(tile_k, Q4K, 1),
        Format::Q5K => go!(tile_k, Q5K, 1),
        // Sixteen rows: 1115-1141 -> 1156-1161 GOP/s on 512 rows of q6_K (q4_K: 1420 -> 1270).
        Format::Q6K => go!(tile_k, Q6K, 1, 16),
    }
}

/// 32 bytes at `a` for lanes 0..8, 32 at `b` for lanes 8..16.
#[inline(always)]
unsafe fn pair32(a: *const u8, b: *const u8) -> __m512i {
    let lo = _mm512_castsi256_si512(_mm256_loadu_si256(a as *const __m256i));
    _mm512_inserti64x4::<1>(lo, _mm256_loadu_si256(b as *const __m256i))
}

/// 8 f16 of each group -> 16 f32.
#[inline(always)]
unsafe fn half16(a: *const u8, b: *const u8) -> __m512 {
    let lo = _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i));
    _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
        lo,
        _mm_loadu_si128(b as *const __m128i),
    ))
}

/// 8 u8 (or i8 when `signed`) of each group -> 16 i32.
#[inline(always)]
unsafe fn bytes16(a: *const u8, b: *const u8, signed: bool) -> __m512i {
    let x = _mm_unpacklo_epi64(
        _mm_loadl_epi64(a as *const __m128i),
        _mm_loadl_epi64(b as *const __m128i),
    );
    if signed {
        _mm512_cvtepi8_epi32(x)
    } else {
        _mm512_cvtepu8_epi32(x)
    }
}

#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// The 8 weight sub-vectors of one 32-block of both groups: `v[j]` lane `r` holds row `r`'s
/// values `4j..4j + 4` (unsigned; q8_0 biased by 128), as `gemm::weights` per group.
#[inline(always)]
unsafe fn weights<const F: u8>(a: *const u8, b: *const u8) -> [__m512i; 8] {
    let mut v = [_mm512_setzero_si512(); 8];
    if F == Q8_0 {
        // `w + 128`: unsigned for `dpbusd`, taken off with the block sum (`tile_n`). Here at
        // the load: as a loop over the tile's weights it went through the stack (~30 % of a
        // single-row q8_0 tile).
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm512_xor_si512(pair32(a.add(32 * j), b.add(32 * j)), _mm512_set1_epi8(-128));
        }
        return v;
    }
    let mut c = [_mm512_setzero_si512(); 6];
    for (i, ci) in c.iter_mut().enumerate().take(plane_chunks(F)) {
        *ci = pair32(a.add(32 * i), b.add(32 * i));
    }
    // `(x & m) | y` for `y` already masked, in one ternary-logic operation.
    const SELECT_OR: i32 = 0xEC;
    if F == Q2K {
        // Four 2-bit values a byte.
        let m2 = _mm512_set1_epi8(0x03);
        for h in 0..2 {
            v[4 * h] = _mm512_and_si512(c[h], m2);
            v[4 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(c[h], 2), m2);
            v[4 * h + 2] = _mm512_and_si512(_mm512_srli_epi16(c[h], 4), m2);
            v[4 * h + 3] = _mm512_and_si512(_mm512_srli_epi16(c[h], 6), m2);
        }
    } else if F == Q5_0 || F == Q5_1 || F == Q5K {
        // Low 5 bits, then 3 bits above them and 2 from chunk 4 (`repack.rs`).
        let hs = [
            _mm512_slli_epi16(c[4], 3),
            _mm512_slli_epi16(c[4], 1),
            _mm512_srli_epi16(c[4], 1),
            _mm512_srli_epi16(c[4], 3),
        ];
        for j in 0..4 {
            v[j] = _mm512_and_si512(c[j], _mm512_set1_epi8(0x1F));
            let hi = _mm512_and_si512(hs[j], _mm512_set1_epi8(0x18));
            let lo = _mm512_srli_epi16(c[j], 5);
            v[j + 4] = _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi8(0x07), SELECT_OR);
        }
    } else if F == Q6K {
        // Low 6 bits, then 2 bits above them and a nibble of chunk 4 or 5.
        let hs = [
            _mm512_slli_epi16(c[4], 2),
            _mm512_srli_epi16(c[4], 2),
            _mm512_slli_epi16(c[5], 2),
            _mm512_srli_epi16(c[5], 2),
        ];
        for j in 0..4 {
            v[j] = _mm512_and_si512(c[j], _mm512_set1_epi8(0x3F));
            let hi = _mm512_and_si512(hs[j], _mm512_set1_epi8(0x3C));
            let lo = _mm512_srli_epi16(c[j], 6);
            v[j + 4] = _mm512_ternarylogic_epi32(lo, hi, _mm512_set1_epi8(0x03), SELECT_OR);
        }
    } else {
        let m4 = _mm512_set1_epi8(0x0F);
        for j in 0..4 {
            v[j] = _mm512_and_si512(c[j], m4);
            v[j + 4] = _mm512_and_si512(_mm512_srli_epi16(c[j], 4), m4);
        }
        if F == IQ4NL || F == IQ4XS {
            // The values by index, `+ 128` (unsigned for `dpbusd`, as q8_0's), a table per
            // 128-bit lane.
            let t = _mm_xor_si128(
                _mm_loadu_si128(IQ4.as_ptr() as *const __m128i),
                _mm_set1_epi8(-128),
            );
            let t = _mm512_broadcast_i32x4(t);
            for vj in v.iter_mut() {
                *vj = _mm512_shuffle_epi8(t, *vj);
            }
        }
    }
    v
}

/// `init` plus the `dpbusd` of `v[p][j]` and `a[4j..4j + 4]` for `j` in `from..to`, for each
/// pair `p`: one broadcast per word for all pairs, two chains each (exact i32 sums, so the
/// grouping is free).
#[inline(always)]
unsafe fn dp<const P: usize>(
    v: &[[__m512i; 8]; P],
    a: *const i8,
    from: usize,
    to: usize,
    init: __m512i,
) -> [__m512i; P] {
    let (mut x, mut y) = ([init; P], [_mm512_setzero_si512(); P]);
    for j in (from..to).step_by(2) {
        let (b0, b1) = (bcast(a.add(4 * j)), bcast(a.add(4 * j + 4)));
        for p in 0..P {
            x[p] = _mm512_dpbusd_epi32(x[p], v[p][j], b0);
            y[p] = _mm512_dpbusd_epi32(y[p], v[p][j + 1], b1);
        }
    }
    for p in 0..P {
        x[p] = _mm512_add_epi32(x[p], y[p]);
    }
    x
}

/// Where each pair's two groups start: `group` holds `2P` equal groups back to back.
#[inline(always)]
unsafe fn pair_ptrs<const P: usize>(group: &[u8]) -> [(*const u8, *const u8); P] {
    let (base, len) = (group.as_ptr(), group.len() / (2 * P));
    std::array::from_fn(|p| (base.add(2 * p * len), base.add((2 * p + 1) * len)))
}

/// i8 lanes `(x, y)` of two 16 x i32 vectors as i16 pairs `(x_r, y_r)` per lane, for `madd`.
#[inline(always)]
unsafe fn pairs(x: __m512i, y: __m512i) -> __m512i {
    _mm512_or_si512(
        _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF)),
        _mm512_slli_epi32(y, 16),
    )
}

// `_planes`: the 32-block tiles unpack a block for sixteen rows already.
#[inline(always)]
unsafe fn tile_n<const F: u8, const MT: usize, const P: usize>(t: &Tile, _planes: *const u8) {
    let Tile {
        group,
        acts,
        i0,
        out,
        ldo,
        cols,
        prefetch,
        ..
    } = *t;
    let f = Format::of_code(F);
    let has_min = F == Q4_1 || F == Q5_1;
    let (hb, sb) = (f.header_bytes(), f.super_bytes());
    let nb = acts.nb;
    let r = acts.rows::<MT>(i0);
    // The lanes' start (`lane_so_far`): `+0.0 + t` is an add the compiler keeps (it is not `t`
    // for `t = -0.0`), so the bits are the cleared lanes'.
    let fzero = _mm512_setzero_ps();
    let mut acc = [[[MaybeUninit::<__m512>::uninit(); 8]; P]; MT];
    let gp = pair_ptrs::<P>(group);
    // What the weights add per unit of the activation block sum: zero points, q8_0's bias.
    let zero = match Format::of_code(F) {
        Format::Q4_0 => 8,
        Format::Q5_0 => 16,
        Format::Q8_0 | Format::IQ4NL => 128,
        Format::Q4_1 | Format::Q5_1 => 0,
        Format::Q2K | Format::Q3K | Format::Q4K | Format::Q5K | Format::Q6K | Format::IQ4XS => {
            unreachable!("not a 32-block format")
        }
    };
    for b in 0..nb {
        let h: [(*const u8, *const u8); P] =
            std::array::from_fn(|p| (gp[p].0.add(b * sb), gp[p].1.add(b * sb)));
        let (mut wd, mut wm) = ([_mm512_setzero_ps(); P], [_mm512_setzero_ps(); P]);
        let mut v = [[_mm512_setzero_si512(); 8]; P];
        for p in 0..P {
            wd[p] = half16(h[p].0, h[p].1);
            if has_min {
                wm[p] = half16(h[p].0.add(16), h[p].1.add(16));
            }
            v[p] = weights::<F>(h[p].0.add(hb), h[p].1.add(hb));
        }
        if MT == 1 || prefetch {
            prefetch_run(group.as_ptr(), group.len(), 2 * P * b * sb, 2 * P * sb);
        }
        each_row!(MT, i, {
            // The zero points' share, `-zero * bsum`, starts the exact integer sum.
            let init = if zero != 0 {
                _mm512_set1_epi32(-zero * *r.bsum[i].add(b))
            } else {
                _mm512_setzero_si512()
            };
            let isum = dp(&v, r.q[i].add(b * QK), 0, 8, init);
            let da = _mm512_set1_ps(*r.d[i].add(b));
            for p in 0..P {
                let scale = _mm512_mul_ps(wd[p], da);
                let mut t = _mm512_mul_ps(scale, _mm512_cvtepi32_ps(isum[p]));
                if has_min {
                    t = _mm512_add_ps(t, _mm512_mul_ps(wm[p], _mm512_set1_ps(*r.s[i].add(b))));
                }
                let lane = &mut acc[i][p];
                lane[b % 8].write(_mm512_add_ps(lane_so_far(lane, b, fzero), t));
            }
        });
    }
    store(&acc, nb, fzero, out, ldo, cols);
}

/// q4_K, q5_K and q6_K as `gemm::tile_k`: per super block, the block dots times their
/// integer sub-block scales summed in i32, the mins against pairs of block sums, one float
/// term.
#[inline(always)]
unsafe fn tile_k<const F: u8, const MT: usize, const P: usize>(t: &Tile, planes: *const u8) {
    let Tile {
        group,
        acts,
        i0,
        out,
        ldo,
        cols,
        prefetch,
        ..
    } = *t;
    let f = Format::of_code(F);
    // q4_K and q5_K have a min per block, q2_K one per half block.
    let has_min = F == Q4K || F == Q5K;
    let mins = has_min || F == Q2K;
    let (bps, hb, pb, sb) = (
        f.blocks_per_super(),
        f.header_bytes(),
        f.plane_bytes(),
        f.super_bytes(),
    );
    let ns = acts.ns;
    let r = acts.rows::<MT>(i0);
    // The lanes' start (`lane_so_far`): `+0.0 + t` is an add the compiler keeps (it is not `t`
    // for `t = -0.0`), so the bits are the cleared lanes'.
    let fzero = _mm512_setzero_ps();
    let mut acc = [[[MaybeUninit::<__m512>::uninit(); 8]; P]; MT];
    let gp = pair_ptrs::<P>(group);
    let zero = _mm512_setzero_si512();
    for s in 0..ns {
        let h: [(*const u8, *const u8); P] =
            std::array::from_fn(|p| (gp[p].0.add(s * sb), gp[p].1.add(s * sb)));
        let mut isum = [[zero; P]; MT];
        let mut msum = [[zero; P]; MT];
        for bi in 0..bps {
            let b = s * bps + bi;
            let pl: [(*const u8, *const u8); P] =
                std::array::from_fn(|p| (h[p].0.add(hb + bi * pb), h[p].1.add(hb + bi * pb)));
            // With `planes`, `unpack_pair` read the group (and prefetched).
            if planes.is_null() && (MT == 1 || prefetch) {
                let per = sb / bps;
                let at = 2 * P * (s * sb + bi * per);
                prefetch_run(group.as_ptr(), group.len(), at, 2 * P * per);
            }
            let mut v = [[zero; 8]; P];
            if planes.is_null() {
                for p in 0..P {
                    v[p] = weights::<F>(pl[p].0, pl[p].1);
                }
            } else {
                let line = planes as *const __m512i;
                for j in 0..8 {
                    v[0][j] = _mm512_load_si512(line.add(8 * b + j));
                }
            }
            if has_min {
                // q4_K, q5_K: `vpdpbusd` sums the 5-bit values' products as the 4-bit ones.
                let mut sc = [zero; P];
                for p in 0..P {
                    sc[p] = bytes16(h[p].0.add(32 + 8 * bi), h[p].1.add(32 + 8 * bi), false);
                }
                each_row!(MT, i, {
                    let d = dp(&v, r.q[i].add(b * QK), 0, 8, zero);
                    for p in 0..P {
                        let d = _mm512_mullo_epi32(d[p], sc[p]);
                        isum[i][p] = _mm512_add_epi32(isum[i][p], d);
                    }
                });
            } else if F == Q2K {
                // A byte per half block, the scale (0..=15) below the min.
                let (mut s0, mut s1, mut mp) = ([zero; P], [zero; P], [zero; P]);
                let m15 = _mm512_set1_epi32(15);
                for p in 0..P {
                    let x0 = bytes16(h[p].0.add(32 + 16 * bi), h[p].1.add(32 + 16 * bi), false);
                    let x1 = bytes16(h[p].0.add(40 + 16 * bi), h[p].1.add(40 + 16 * bi), false);
                    s0[p] = _mm512_and_si512(x0, m15);
                    s1[p] = _mm512_and_si512(x1, m15);
                    mp[p] = pairs(_mm512_srli_epi32(x0, 4), _mm512_srli_epi32(x1, 4));
                }
                each_row!(MT, i, {
                    let a = r.q[i].add(b * QK);
                    let (d0, d1) = (dp(&v, a, 0, 4, zero), dp(&v, a, 4, 8, zero));
                    let hs = _mm512_set1_epi32(*r.hpair[i].add(b));
                    for p in 0..P {
                        let h = _mm512_add_epi32(
                            _mm512_mullo_epi32(d0[p], s0[p]),
                            _mm512_mullo_epi32(d1[p], s1[p]),
                        );
                        isum[i][p] = _mm512_add_epi32(isum[i][p], h);
                        msum[i][p] = _mm512_add_epi32(msum[i][p], _mm512_madd_epi16(mp[p], hs));
                    }
                });
            } else if F == IQ4XS {
                // Signed block scales; the values `+ 128` (`weights`), taken off with the sum.
                let mut sc = [zero; P];
                for p in 0..P {
                    sc[p] = bytes16(h[p].0.add(16 + 8 * bi), h[p].1.add(16 + 8 * bi), true);
                }
                each_row!(MT, i, {
                    let init = _mm512_set1_epi32(-128 * *r.bsum[i].add(b));
                    let d = dp(&v, r.q[i].add(b * QK), 0, 8, init);
                    for p in 0..P {
                        let d = _mm512_mullo_epi32(d[p], sc[p]);
                        isum[i][p] = _mm512_add_epi32(isum[i][p], d);
                    }
                });
            } else {
                let (mut s0, mut s1, mut sc01) = ([zero; P], [zero; P], [zero; P]);
                for p in 0..P {
                    s0[p] = bytes16(h[p].0.add(16 + 16 * bi), h[p].1.add(16 + 16 * bi), true);
                    s1[p] = bytes16(h[p].0.add(24 + 16 * bi), h[p].1.add(24 + 16 * bi), true);
                    sc01[p] = pairs(s0[p], s1[p]);
                }
                each_row!(MT, i, {
                    // s0 * h0 + s1 * h1 - z * (s0 * hs0 + s1 * hs1), z 32 (q6_K) or 4 (q3_K),
                    // all exact i32.
                    let a = r.q[i].add(b * QK);
                    let (d0, d1) = (dp(&v, a, 0, 4, zero), dp(&v, a, 4, 8, zero));
                    let hs = _mm512_set1_epi32(*r.hpair[i].add(b));
                    for p in 0..P {
                        let h = _mm512_add_epi32(
                            _mm512_mullo_epi32(d0[p], s0[p]),
                            _mm512_mullo_epi32(d1[p], s1[p]),
                        );
                        let m = _mm512_madd_epi16(sc01[p], hs);
                        let corr = if F == Q3K {
                            _mm512_slli_epi32(m, 2)
                        } else {
                            _mm512_slli_epi32(m, 5)
                        };
                        isum[i][p] = _mm512_add_epi32(isum[i][p], _mm512_sub_epi32(h, corr));
                    }
                });
            }
        }
        let mut wd = [_mm512_setzero_ps(); P];
        for p in 0..P {
            wd[p] = half16(h[p].0, h[p].1);
        }
        if has_min {
            for q in 0..bps / 2 {
                let mut mp = [zero; P];
                for p in 0..P {
                    let m0 = bytes16(h[p].0.add(96 + 16 * q), h[p].1.add(96 + 16 * q), false);
                    let m1 = bytes16(h[p].0.add(104 + 16 * q), h[p].1.add(104 + 16 * q), false);
                    mp[p] = pairs(m0, m1);
                }
                each_row!(MT, i, {
                    let bp = _mm512_set1_epi32(*r.bpair[i].add(s * bps / 2 + q));
                    for p in 0..P {
                        msum[i][p] = _mm512_add_epi32(msum[i][p], _mm512_madd_epi16(mp[p], bp));
                    }
                });
            }
        }
        if mins {
            // -dmin, by its sign bit (no AVX-512 DQ needed).
            let mut wm = [_mm512_setzero_ps(); P];
            for p in 0..P {
                wm[p] = _mm512_castsi512_ps(_mm512_xor_si512(
                    _mm512_castps_si512(half16(h[p].0.add(16), h[p].1.add(16))),
                    _mm512_set1_epi32(i32::MIN),
                ));
            }
            each_row!(MT, i, {
                let da = _mm512_set1_ps(*r.d[i].add(s));
                for p in 0..P {
                    let t = _mm512_mul_ps(_mm512_mul_ps(wd[p], da), _mm512_cvtepi32_ps(isum[i][p]));
                    let tm =
                        _mm512_mul_ps(_mm512_mul_ps(wm[p], da), _mm512_cvtepi32_ps(msum[i][p]));
                    let lane = &mut acc[i][p];
                    let sum = _mm512_add_ps(t, tm);
                    lane[s % 8].write(_mm512_add_ps(lane_so_far(lane, s, fzero), sum));
                }
            });
        } else {
            each_row!(MT, i, {
                let da = _mm512_set1_ps(*r.d[i].add(s));
                for p in 0..P {
                    let t = _mm512_mul_ps(_mm512_mul_ps(wd[p], da), _mm512_cvtepi32_ps(isum[i][p]));
                    let lane = &mut acc[i][p];
                    lane[s % 8].write(_mm512_add_ps(lane_so_far(lane, s, fzero), t));
                }
            });
        }
    }
    store(&acc, ns, fzero, out, ldo, cols);
}

/// What term `term` of a tile's output vector adds to: its lane (`term % 8`) as summed so far,
/// or for each lane's first term the tile's zero. The lanes start as that zero without being
/// stored: clearing them in memory first (16 KB for a sixteen-row tile) took 4-5 % of a
/// prefill's GEMM time. The same adds, so the same bits. (On the 256-bit tiles the same
/// change made q8_0 and q4_1 14 % slower: there the lanes are cleared.)
///
/// # Safety
/// Lane `term % 8` has been written if `term >= 8` (terms come in order).
#[inline(always)]
unsafe fn lane_so_far<V: Copy>(lanes: &[MaybeUninit<V>; 8], term: usize, zero: V) -> V {
    if term < 8 {
        zero
    } else {
        lanes[term % 8].assume_init()
    }
}

/// The eight lanes after `terms` terms, the ones no term reached as the zero they start from.
///
/// # Safety
/// Terms `0..terms` have been added (`lane_so_far`).
#[inline(always)]
unsafe fn lanes_after<V: Copy>(lanes: &[MaybeUninit<V>; 8], terms: usize, zero: V) -> [V; 8] {
    let mut l = [zero; 8];
    for (k, x) in l.iter_mut().enumerate().take(terms) {
        *x = lanes[k].assume_init();
    }
    l
}

/// The canonical lane reduction of each row's accumulators, stored to `cols` columns.
#[inline(always)]
unsafe fn store<const MT: usize, const P: usize>(
    acc: &[[[MaybeUninit<__m512>; 8]; P]; MT],
    terms: usize,
    zero: __m512,
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    for (i, pairs) in acc.iter().enumerate() {
        for (p, lanes) in pairs.iter().enumerate() {
            let l = lanes_after(lanes, terms, zero);
            let r = _mm512_add_ps(
                _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
                _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])),
            );
            let (dst, left) = (
                out.add(i * ldo + 2 * ROWS * p),
                cols.saturating_sub(2 * ROWS * p),
            );
            if left >= 2 * ROWS {
                _mm512_storeu_ps(dst, r);
            } else if left > 0 {
                let mut tmp = [0f32; 2 * ROWS];
                _mm512_storeu_ps(tmp.as_mut_ptr(), r);
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, left);
            }
        }
    }
}
