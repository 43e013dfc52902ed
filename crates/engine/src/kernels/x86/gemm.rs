//! The GEMM over repacked groups (`repack.rs`): a tile is 8 weight rows x up to 8
//! activation rows (decode's single rows of the 32-block formats: 16 weight rows, two groups,
//! sharing the row's broadcasts and scalar work). Per 32-block, each weight sub-vector (4
//! values of each of the 8 rows) is unpacked once in registers and multiplied (AVX2
//! `maddubs`, or AVX-512 VNNI `vpdpbusd`: `Dots`) against every activation row's 4 broadcast
//! bytes, so 8 rows' exact integer block dots come out in 8 lanes with no horizontal
//! reduction. Unsigned weights with a zero point (q4_0: 8, q5_0: 16, q6_K: 32) are
//! corrected exactly by the activation block sums. The K formats multiply in their integer
//! sub-block scales and mins and sum a whole 256-value super block in integers (activations
//! carry one scale per 256 values there). The float part is the canonical one of `portable.rs`:
//! `(wd * ad) * isum (+ wm * as)` per scale block, added into lane `term % 8` of the output,
//! lanes reduced by the same tree, so every output has the bits of the portable path whatever
//! the tile, the thread or the other rows.

// Lane and sub-block indices are the layout; index loops say it most plainly.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::Line;
use crate::kernels::repack::ROWS;
pub(crate) use crate::kernels::tile::{tile_rows, Tile};
use crate::kernels::{Format, IQ4, QK};

/// Least distance streaming calls prefetch ahead.
const AHEAD: usize = 12 << 10;

/// Decode streams the weights from memory once. A tile reads its groups side by side, but
/// they lie back to back, and the next tile's follow. So each block prefetches its share
/// `at..at + bytes` of the next tile (`tile` bytes on, at least `AHEAD`), `at` growing as the
/// tile consumes all its groups together: one sequential stream a thread, a tile ahead of the
/// reads. (The same sweep a fixed 24 KiB ahead was short of long rows' tiles, whose later
/// groups were then read cold: q6_K rows of 8960 values read 0.79 of a plain read's
/// bandwidth, 0.93 now; each group prefetching its own stream read 0.78-0.92 on every
/// shape, two Zen 5 threads.)
#[inline(always)]
pub(crate) unsafe fn prefetch_run(base: *const u8, tile: usize, at: usize, bytes: usize) {
    let p = base.wrapping_add(at + tile.max(AHEAD));
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(line) as *const i8);
    }
}

pub(crate) use crate::kernels::formats::code::*;

/// Formats whose weights are signed bytes, multiplied as q8_0's.
pub(crate) const fn signed(f: u8) -> bool {
    matches!(f, Q8_0 | IQ4NL | IQ4XS)
}

/// 32-byte chunks in a 32-block's plane of the packed-nibble formats (`repack.rs`): four of
/// nibbles, one more for the 5-bit formats' top bits, two for q6_K's; q2_K's two of 2-bit
/// values.
pub(crate) const fn plane_chunks(f: u8) -> usize {
    match f {
        Q2K => 2,
        Q5_0 | Q5_1 | Q5K => 5,
        Q6K => 6,
        Q4_0 | Q4_1 | Q8_0 | Q3K | Q4K | IQ4NL | IQ4XS => 4,
        _ => panic!("no format has this code"),
    }
}

/// The tile by the AVX2 (`maddubs`) integer dots.
///
/// # Safety
/// AVX2 and F16C present; `t.group` is a whole repacked group of `t.f` for `t.acts.nb` blocks;
/// `t.out` has room for `t.mt` rows of `t.cols` columns at stride `t.ldo`.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn tile_avx2(t: &Tile) {
    tile::<Avx2>(t, std::ptr::null())
}

/// As `tile_avx2`, the integer dots by AVX-512 VNNI (`vpdpbusd` on 256-bit vectors): the same
/// exact i32 sums, so the same bits.
///
/// # Safety
/// As `tile_avx2`, and AVX-512 F, VL and VNNI present.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_vnni(t: &Tile) {
    tile::<Vnni>(t, std::ptr::null())
}

/// As `tile_avx2` for a format that `unpacks`, its blocks' weights read from `planes` as
/// `unpack_group` wrote them for `t.group`.
///
/// # Safety
/// As `tile_avx2`; `planes` holds `unpack_group`'s lines for `t.group`.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn tile_avx2_planes(t: &Tile, planes: &[Line]) {
    assert!(unpacks(t.f) && planes.len() >= 4 * t.acts.nb);
    tile::<Avx2>(t, planes.as_ptr() as *const u8)
}

/// As `tile_avx2_planes` by the AVX-512 VNNI dots (`tile_vnni`).
///
/// # Safety
/// As `tile_avx2_planes`, and AVX-512 F, VL and VNNI present.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_vnni_planes(t: &Tile, planes: &[Line]) {
    assert!(unpacks(t.f) && planes.len() >= 4 * t.acts.nb);
    tile::<Vnni>(t, planes.as_ptr() as *const u8)
}

/// The unpacked weights of one group (`nb` 32-blocks) of a format that `unpacks`: per block
/// the 8 vectors `weights` gives, two to a line, so that the tiles of a chunk's rows unpack
/// each block once, not once per tile (20 % of q5_K's and iq4_xs's tile time on the Xeon).
/// `prefetch` as a tile's: the run ahead, for calls that stream their weights.
///
/// # Safety
/// AVX2 present; `group` holds `nb` blocks of `f`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn unpack_group(
    f: Format,
    group: &[u8],
    nb: usize,
    prefetch: bool,
    out: &mut [Line],
) {
    assert!(unpacks(f) && out.len() >= 4 * nb);
    match f {
        Format::Q5_0 => unpack::<Q5_0>(group, nb, prefetch, out),
        Format::Q5_1 => unpack::<Q5_1>(group, nb, prefetch, out),
        Format::IQ4XS => unpack::<IQ4XS>(group, nb, prefetch, out),
        Format::Q3K => unpack::<Q3K>(group, nb, prefetch, out),
        Format::Q2K => unpack::<Q2K>(group, nb, prefetch, out),
        Format::Q4K => unpack::<Q4K>(group, nb, prefetch, out),
        Format::Q5K => unpack::<Q5K>(group, nb, prefetch, out),
        Format::Q6K => unpack::<Q6K>(group, nb, prefetch, out),
        Format::Q4_0 | Format::Q4_1 | Format::Q8_0 | Format::IQ4NL => {
            unreachable!("{f:?} is read packed, not unpacked")
        }
    }
}

/// Whether chunks of `f`'s rows read its groups unpacked once (`unpack_group`): the K and
/// 5-bit formats, whose unpacking costs more than reading it back. Not q4_0, q4_1 and
/// iq4_nl (on the Xeon's VNNI-256 tiles 2-3 % slower unpacked) nor q8_0 (its bytes).
pub(crate) fn unpacks(f: Format) -> bool {
    f.is_k() || matches!(f, Format::Q5_0 | Format::Q5_1)
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
    let dst = out.as_mut_ptr() as *mut __m256i;
    for blk in 0..nb {
        let (s, bi) = (blk / bps, blk % bps);
        if prefetch {
            let per = sb / bps;
            prefetch_run(group.as_ptr(), group.len(), s * sb + bi * per, per);
        }
        let v = weights::<F>(group.as_ptr().add(s * sb + hb + bi * pb));
        for (j, vj) in v.iter().enumerate() {
            _mm256_store_si256(dst.add(8 * blk + j), *vj);
        }
    }
}

/// As `tile_avx2` for one activation row over two whole groups back to back (`t.cols` up to
/// 16) of a 32-block format: decode's tile, where the row's broadcasts, zero points and scales
/// and the loop serve 16 weight rows instead of 8.
///
/// # Safety
/// As `tile_avx2`, with two groups in `t.group`, `t.mt == 1` and `t.f` not a K format.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn tile_avx2_pair(t: &Tile) {
    pair::<Avx2>(t)
}

/// As `tile_avx2_pair` by the AVX-512 VNNI dots (`tile_vnni`).
///
/// # Safety
/// As `tile_avx2_pair`, and AVX-512 F, VL and VNNI present.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn tile_vnni_pair(t: &Tile) {
    pair::<Vnni>(t)
}

#[inline(always)]
unsafe fn pair<D: Dots>(t: &Tile) {
    assert!(
        t.mt == 1 && !t.f.is_k(),
        "two-group tiles take one row of a 32-block format"
    );
    let none = std::ptr::null();
    match t.f {
        Format::Q4_0 => tile_n::<D, Q4_0, 1, 2>(t, none),
        Format::Q4_1 => tile_n::<D, Q4_1, 1, 2>(t, none),
        Format::Q5_0 => tile_n::<D, Q5_0, 1, 2>(t, none),
        Format::Q5_1 => tile_n::<D, Q5_1, 1, 2>(t, none),
        Format::IQ4NL => tile_n::<D, IQ4NL, 1, 2>(t, none),
        Format::Q8_0 => tile_n::<D, Q8_0, 1, 2>(t, none),
        Format::Q2K | Format::Q3K | Format::Q4K | Format::Q5K | Format::Q6K | Format::IQ4XS => {
            unreachable!("{:?} takes no two-group tile", t.f)
        }
    }
}

#[inline(always)]
unsafe fn tile<D: Dots>(t: &Tile, planes: *const u8) {
    let (f, mt) = (t.f, t.mt);
    // 32-block formats run `tile_n`, K formats `tile_k`; each for the four tile heights.
    macro_rules! go {
        ($kernel:ident, $c:expr $(, $p:expr)?) => {
            match mt {
                1 => $kernel::<D, $c, 1 $(, $p)?>(t, planes),
                2 => $kernel::<D, $c, 2 $(, $p)?>(t, planes),
                4 => $kernel::<D, $c, 4 $(, $p)?>(t, planes),
                8 => $kernel::<D, $c, 8 $(, $p)?>(t, planes),
                _ => unreachable!("a tile of {mt} rows"),
            }
        };
    }
    match f {
        Format::Q4_0 => go!(tile_n, Q4_0, 1),
        Format::Q4_1 => go!(tile_n, Q4_1, 1),
        Format::Q5_0 => go!(tile_n, Q5_0, 1),
        Format::Q5_1 => go!(tile_n, Q5_1, 1),
        Format::Q8_0 => go!(tile_n, Q8_0, 1),
        Format::Q4K => go!(tile_k, Q4K),
        Format::IQ4NL => go!(tile_n, IQ4NL, 1),
        Format::Q5K => go!(tile_k, Q5K),
        Format::IQ4XS => go!(tile_k, IQ4XS),
        Format::Q3K => go!(tile_k, Q3K),
        Format::Q2K => go!(tile_k, Q2K),
        Format::Q6K => go!(tile_k, Q6K),
    }
}

#[inline(always)]
unsafe fn bcast(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// 8 f16 -> 8 f32.
#[inline(always)]
unsafe fn half8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// 8 u8 (or i8 when `signed`) -> 8 i32.
#[inline(always)]
unsafe fn bytes8(p: *const u8, signed: bool) -> __m256i {
    let b = _mm_loadl_epi64(p as *const __m128i);
    if signed {
        _mm256_cvtepi8_epi32(b)
    } else {
        _mm256_cvtepu8_epi32(b)
    }
}

/// The 8 weight sub-vectors of one 32-block: `v[j]` lane `r` holds row `r`'s values
/// `4j..4j + 4` (unsigned; q8_0 and the iq4 formats signed).
#[inline(always)]
unsafe fn weights<const F: u8>(p: *const u8) -> [__m256i; 8] {
    let mut v = [_mm256_setzero_si256(); 8];
    if F == Q8_0 {
        for (j, vj) in v.iter_mut().enumerate() {
            *vj = _mm256_loadu_si256(p.add(32 * j) as *const __m256i);
        }
        return v;
    }
    let mut c = [_mm256_setzero_si256(); 6];
    for (i, ci) in c.iter_mut().enumerate().take(plane_chunks(F)) {
        *ci = _mm256_loadu_si256(p.add(32 * i) as *const __m256i);
    }
    if F == Q2K {
        // Four 2-bit values a byte.
        let m2 = _mm256_set1_epi8(0x03);
        for (h, ch) in c.iter().take(2).enumerate() {
            v[4 * h] = _mm256_and_si256(*ch, m2);
            v[4 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(*ch, 2), m2);
            v[4 * h + 2] = _mm256_and_si256(_mm256_srli_epi16(*ch, 4), m2);
            v[4 * h + 3] = _mm256_and_si256(_mm256_srli_epi16(*ch, 6), m2);
        }
    } else if F == Q5_0 || F == Q5_1 || F == Q5K {
        // Low 5 bits, then 3 bits above them and 2 from chunk 4 (`repack.rs`).
        let hs = [
            _mm256_slli_epi16(c[4], 3),
            _mm256_slli_epi16(c[4], 1),
            _mm256_srli_epi16(c[4], 1),
            _mm256_srli_epi16(c[4], 3),
        ];
        for j in 0..4 {
            v[j] = _mm256_and_si256(c[j], _mm256_set1_epi8(0x1F));
            let lo = _mm256_and_si256(_mm256_srli_epi16(c[j], 5), _mm256_set1_epi8(0x07));
            v[j + 4] = _mm256_or_si256(lo, _mm256_and_si256(hs[j], _mm256_set1_epi8(0x18)));
        }
    } else if F == Q6K {
        // Low 6 bits, then 2 bits above them and a nibble of chunk 4 or 5.
        let hs = [
            _mm256_slli_epi16(c[4], 2),
            _mm256_srli_epi16(c[4], 2),
            _mm256_slli_epi16(c[5], 2),
            _mm256_srli_epi16(c[5], 2),
        ];
        for j in 0..4 {
            v[j] = _mm256_and_si256(c[j], _mm256_set1_epi8(0x3F));
            let lo = _mm256_and_si256(_mm256_srli_epi16(c[j], 6), _mm256_set1_epi8(0x03));
            v[j + 4] = _mm256_or_si256(lo, _mm256_and_si256(hs[j], _mm256_set1_epi8(0x3C)));
        }
    } else {
        let m4 = _mm256_set1_epi8(0x0F);
        for j in 0..4 {
            v[j] = _mm256_and_si256(c[j], m4);
            v[j + 4] = _mm256_and_si256(_mm256_srli_epi16(c[j], 4), m4);
        }
        if F == IQ4NL || F == IQ4XS {
            // The 16 values by index, one table per 128-bit lane.
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4.as_ptr() as *const __m128i));
            for vj in v.iter_mut() {
                *vj = _mm256_shuffle_epi8(t, *vj);
            }
        }
    }
    v
}

/// The exact integer dot of one 32-block for the 8 weight rows of `v` (`weights`) and one
/// activation row `a`, as 8 i32 lanes, per instruction set. Weight values are unsigned except
/// q8_0's (`q8_prep` gives the form `q8` multiplies).
trait Dots {
    /// What `q8` adds to the true dot per unit of the activation block's sum (q8_0 weights
    /// biased to unsigned); the caller subtracts it like the zero points of q4_0 and q5_0.
    const Q8_BIAS: i32;
    /// q8_0's weights (-128..=127) in the form `q8` multiplies, once per block for all rows.
    unsafe fn q8_prep(v: &[__m256i; 8]) -> [__m256i; 8];
    /// q4_0, q4_1 (values 0..=15).
    unsafe fn q4(v: &[__m256i; 8], a: *const i8) -> __m256i;
    /// q5_0, q5_1 (0..=31).
    unsafe fn q5(v: &[__m256i; 8], a: *const i8) -> __m256i;
    /// q8_0: `v` the weights, `p` their `q8_prep` form.
    unsafe fn q8(v: &[__m256i; 8], p: &[__m256i; 8], a: *const i8) -> __m256i;
    /// iq4_xs: `(q8 dot - Q8_BIAS * bsum)` times `sc` (i32 lanes, -32..=31).
    #[inline(always)]
    unsafe fn q8s(
        v: &[__m256i; 8],
        p: &[__m256i; 8],
        a: *const i8,
        bsum: i32,
        sc: __m256i,
    ) -> __m256i {
        let d = _mm256_sub_epi32(Self::q8(v, p, a), _mm256_set1_epi32(Self::Q8_BIAS * bsum));
        _mm256_mullo_epi32(d, sc)
    }
    /// q4_K: the dot times `sc` (i32 lanes, 0..=63).
    unsafe fn q4k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i;
    /// q5_K (0..=31): the dot times `sc`.
    unsafe fn q5k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i;
    /// q6_K (0..=63): `s0` times the first half's dot plus `s1` times the second's (i32
    /// lanes, -128..=127).
    unsafe fn q6k(v: &[__m256i; 8], a: *const i8, s0: __m256i, s1: __m256i) -> __m256i;
}

/// `maddubs` into i16 pair sums, widened by `madd`.
struct Avx2;

/// `vpdpbusd`: four products summed straight into i32.
struct Vnni;

/// The i16 sums of `maddubs(v[j], a[4j..4j + 4])` for `j` in `from..to`. Callers keep them in
/// range: at most 8 q4, 4 q5 or 2 q6 terms (|a| <= 127).
#[inline(always)]
unsafe fn sum16(v: &[__m256i; 8], a: *const i8, from: usize, to: usize) -> __m256i {
    let mut s = _mm256_maddubs_epi16(v[from], bcast(a.add(4 * from)));
    for j in from + 1..to {
        s = _mm256_add_epi16(s, _mm256_maddubs_epi16(v[j], bcast(a.add(4 * j))));
    }
    s
}

/// The signed weights' dot (`q8_prep`'s |w| times a with w's sign), each term's i16 pairs
/// widened by one `madd` against `m` (ones, or a block scale in both halves).
#[inline(always)]
unsafe fn signed_dot(v: &[__m256i; 8], p: &[__m256i; 8], a: *const i8, m: __m256i) -> __m256i {
    let mut s = _mm256_setzero_si256();
    for j in 0..8 {
        let aj = _mm256_sign_epi8(bcast(a.add(4 * j)), v[j]);
        s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(p[j], aj), m));
    }
    s
}

impl Dots for Avx2 {
    const Q8_BIAS: i32 = 0;

    /// Absolute values: `maddubs` multiplies them by the activations with the weights' signs.
    #[inline(always)]
    unsafe fn q8_prep(v: &[__m256i; 8]) -> [__m256i; 8] {
        let mut p = *v;
        for x in p.iter_mut() {
            *x = _mm256_abs_epi8(*x);
        }
        p
    }
    #[inline(always)]
    unsafe fn q4(v: &[__m256i; 8], a: *const i8) -> __m256i {
        _mm256_madd_epi16(sum16(v, a, 0, 8), _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn q5(v: &[__m256i; 8], a: *const i8) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        _mm256_add_epi32(
            _mm256_madd_epi16(sum16(v, a, 0, 4), ones),
            _mm256_madd_epi16(sum16(v, a, 4, 8), ones),
        )
    }

    #[inline(always)]
    unsafe fn q8(v: &[__m256i; 8], p: &[__m256i; 8], a: *const i8) -> __m256i {
        signed_dot(v, p, a, _mm256_set1_epi16(1))
    }

    #[inline(always)]
    unsafe fn q8s(
        v: &[__m256i; 8],
        p: &[__m256i; 8],
        a: *const i8,
        _bsum: i32,
        sc: __m256i,
    ) -> __m256i {
        // The scale as the pair multiplier of the `madd` that widens each term: no `mullo`
        // (the exact integer sum: |pair| <= 2 * 127 * 127, times |sc| <= 32, eight terms).
        signed_dot(v, p, a, pairs(sc, sc))
    }

    #[inline(always)]
    unsafe fn q4k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i {
        _mm256_madd_epi16(sum16(v, a, 0, 8), pairs(sc, sc))
    }

    #[inline(always)]
    unsafe fn q5k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i {
        // Two sums of four: eight 5-bit terms may pass i16.
        let p = pairs(sc, sc);
        _mm256_add_epi32(
            _mm256_madd_epi16(sum16(v, a, 0, 4), p),
            _mm256_madd_epi16(sum16(v, a, 4, 8), p),
        )
    }

    #[inline(always)]
    unsafe fn q6k(v: &[__m256i; 8], a: *const i8, s0: __m256i, s1: __m256i) -> __m256i {
        let (p0, p1) = (pairs(s0, s0), pairs(s1, s1));
        let h0 = _mm256_add_epi32(
            _mm256_madd_epi16(sum16(v, a, 0, 2), p0),
            _mm256_madd_epi16(sum16(v, a, 2, 4), p0),
        );
        let h1 = _mm256_add_epi32(
            _mm256_madd_epi16(sum16(v, a, 4, 6), p1),
            _mm256_madd_epi16(sum16(v, a, 6, 8), p1),
        );
        _mm256_add_epi32(h0, h1)
    }
}

/// `dpbusd` of `v[j]` and `a[4j..4j + 4]` for `j` in `from..to`, in two chains.
#[inline(always)]
unsafe fn dp(v: &[__m256i; 8], a: *const i8, from: usize, to: usize) -> __m256i {
    let (mut x, mut y) = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for j in (from..to).step_by(2) {
        x = _mm256_dpbusd_epi32(x, v[j], bcast(a.add(4 * j)));
        y = _mm256_dpbusd_epi32(y, v[j + 1], bcast(a.add(4 * j + 4)));
    }
    _mm256_add_epi32(x, y)
}

impl Dots for Vnni {
    /// `dpbusd` takes unsigned weights: `w + 128` (the sign bit flipped) costs one xor per
    /// block, where the signs moved onto the activations cost one `sign` per row.
    const Q8_BIAS: i32 = 128;

    #[inline(always)]
    unsafe fn q8_prep(v: &[__m256i; 8]) -> [__m256i; 8] {
        let mut p = *v;
        for x in p.iter_mut() {
            *x = _mm256_xor_si256(*x, _mm256_set1_epi8(-128));
        }
        p
    }
    #[inline(always)]
    unsafe fn q4(v: &[__m256i; 8], a: *const i8) -> __m256i {
        dp(v, a, 0, 8)
    }

    #[inline(always)]
    unsafe fn q5(v: &[__m256i; 8], a: *const i8) -> __m256i {
        dp(v, a, 0, 8)
    }

    #[inline(always)]
    unsafe fn q8(_v: &[__m256i; 8], p: &[__m256i; 8], a: *const i8) -> __m256i {
        dp(p, a, 0, 8)
    }

    #[inline(always)]
    unsafe fn q4k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i {
        _mm256_mullo_epi32(dp(v, a, 0, 8), sc)
    }

    #[inline(always)]
    unsafe fn q5k(v: &[__m256i; 8], a: *const i8, sc: __m256i) -> __m256i {
        _mm256_mullo_epi32(dp(v, a, 0, 8), sc)
    }

    #[inline(always)]
    unsafe fn q6k(v: &[__m256i; 8], a: *const i8, s0: __m256i, s1: __m256i) -> __m256i {
        _mm256_add_epi32(
            _mm256_mullo_epi32(dp(v, a, 0, 4), s0),
            _mm256_mullo_epi32(dp(v, a, 4, 8), s1),
        )
    }
}

/// A zero the compiler cannot see: a tile's accumulators (up to 4 KiB) are then cleared with
/// vector stores in place, not by a `memset` call (~6 % of a batch-32 SmolLM2 decode step).
#[inline(always)]
pub(crate) fn opaque_zero<T>(z: T) -> T {
    std::hint::black_box(z)
}

/// `body` for each row `i` in `0..mt` (1, 2, 4, 8 or 16), unrolled, so per-row pointers and
/// indices are constants.
macro_rules! each_row {
    ($mt:expr, $i:ident, $body:block) => {{
        {
            let $i = 0;
            $body
        }
        if $mt > 1 {
            let $i = 1;
            $body
        }
        if $mt > 2 {
            let $i = 2;
            $body
            let $i = 3;
            $body
        }
        if $mt > 4 {
            let $i = 4;
            $body
            let $i = 5;
            $body
            let $i = 6;
            $body
            let $i = 7;
            $body
        }
        if $mt > 8 {
            let $i = 8;
            $body
            let $i = 9;
            $body
            let $i = 10;
            $body
            let $i = 11;
            $body
            let $i = 12;
            $body
            let $i = 13;
            $body
            let $i = 14;
            $body
            let $i = 15;
            $body
        }
    }};
}
pub(crate) use each_row;

/// The 32-block formats over `P` groups back to back (1, or 2 for single rows).
#[inline(always)]
unsafe fn tile_n<D: Dots, const F: u8, const MT: usize, const P: usize>(
    t: &Tile,
    planes: *const u8,
) {
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
    let mut acc = [[[opaque_zero(_mm256_setzero_ps()); 8]; MT]; P];
    let gp: [*const u8; P] = std::array::from_fn(|p| group.as_ptr().add(p * group.len() / P));
    for b in 0..nb {
        let mut wd = [_mm256_setzero_ps(); P];
        let mut wm = [_mm256_setzero_ps(); P];
        let mut v = [[_mm256_setzero_si256(); 8]; P];
        let mut q = [[_mm256_setzero_si256(); 8]; P];
        for p in 0..P {
            let hdr = gp[p].add(b * sb);
            wd[p] = half8(hdr);
            if has_min {
                wm[p] = half8(hdr.add(16));
            }
            if planes.is_null() {
                v[p] = weights::<F>(hdr.add(hb));
            } else {
                let line = planes as *const __m256i;
                for (j, vj) in v[p].iter_mut().enumerate() {
                    *vj = _mm256_load_si256(line.add(8 * b + j));
                }
            }
            q[p] = if signed(F) { D::q8_prep(&v[p]) } else { v[p] };
        }
        // With `planes`, `unpack_group` read the group (and prefetched).
        if planes.is_null() && (MT == 1 || prefetch) {
            prefetch_run(group.as_ptr(), group.len(), P * b * sb, P * sb);
        }
        each_row!(MT, i, {
            let a = r.q[i].add(b * QK);
            let bsum = *r.bsum[i].add(b);
            let da = _mm256_set1_ps(*r.d[i].add(b));
            for p in 0..P {
                let (v, q) = (&v[p], &q[p]);
                let isum = match Format::of_code(F) {
                    Format::Q4_0 => _mm256_sub_epi32(D::q4(v, a), _mm256_set1_epi32(8 * bsum)),
                    Format::Q4_1 => D::q4(v, a),
                    Format::Q5_1 => D::q5(v, a),
                    Format::Q5_0 => _mm256_sub_epi32(D::q5(v, a), _mm256_set1_epi32(16 * bsum)),
                    Format::Q8_0 | Format::IQ4NL => {
                        _mm256_sub_epi32(D::q8(v, q, a), _mm256_set1_epi32(D::Q8_BIAS * bsum))
                    }
                    Format::Q2K
                    | Format::Q3K
                    | Format::Q4K
                    | Format::Q5K
                    | Format::Q6K
                    | Format::IQ4XS => unreachable!("not a 32-block format"),
                };
                let scale = _mm256_mul_ps(wd[p], da);
                let mut t = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum));
                if has_min {
                    t = _mm256_add_ps(t, _mm256_mul_ps(wm[p], _mm256_set1_ps(*r.s[i].add(b))));
                }
                let lane = &mut acc[p][i][b % 8];
                *lane = _mm256_add_ps(*lane, t);
            }
        });
    }
    for (p, acc) in acc.iter().enumerate() {
        let left = cols.saturating_sub(ROWS * p);
        if left > 0 {
            store(acc, out.add(ROWS * p), ldo, left);
        }
    }
}

/// The canonical lane reduction of each row's accumulators, stored to `cols` columns.
#[inline(always)]
unsafe fn store<const MT: usize>(acc: &[[__m256; 8]; MT], out: *mut f32, ldo: usize, cols: usize) {
    for (i, l) in acc.iter().enumerate() {
        let r = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(l[0], l[4]), _mm256_add_ps(l[2], l[6])),
            _mm256_add_ps(_mm256_add_ps(l[1], l[5]), _mm256_add_ps(l[3], l[7])),
        );
        let dst = out.add(i * ldo);
        if cols >= ROWS {
            _mm256_storeu_ps(dst, r);
        } else {
            let mut tmp = [0f32; ROWS];
            _mm256_storeu_ps(tmp.as_mut_ptr(), r);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, cols);
        }
    }
}

/// i8 lanes `(x, y)` of two 8 x i32 vectors as i16 pairs `(x_r, y_r)` per lane, for `madd`.
#[inline(always)]
unsafe fn pairs(x: __m256i, y: __m256i) -> __m256i {
    _mm256_or_si256(
        _mm256_and_si256(x, _mm256_set1_epi32(0xFFFF)),
        _mm256_slli_epi32(y, 16),
    )
}

/// q4_K, q5_K and q6_K: per super block, each 32-block's dot is scaled by its integer
/// sub-block scales and summed in i32 (`isum`); q4_K's and q5_K's mins give `msum` = sum of `min * block sum`.
/// One float term per super block: `(wd * ad) * isum (+ (wm * ad) * msum)`.
#[inline(always)]
unsafe fn tile_k<D: Dots, const F: u8, const MT: usize>(t: &Tile, planes: *const u8) {
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
    let mut acc = [[opaque_zero(_mm256_setzero_ps()); 8]; MT];
    let gp = group.as_ptr();
    for s in 0..ns {
        let hdr = gp.add(s * sb);
        let mut isum = [_mm256_setzero_si256(); MT];
        let mut msum = [_mm256_setzero_si256(); MT];
        for bi in 0..bps {
            let b = s * bps + bi;
            let plane = hdr.add(hb + bi * pb);
            // With `planes`, `unpack_group` read the group (and prefetched).
            if planes.is_null() && (MT == 1 || prefetch) {
                let per = sb / bps;
                prefetch_run(gp, group.len(), s * sb + bi * per, per);
            }
            let mut v = [_mm256_setzero_si256(); 8];
            if planes.is_null() {
                v = weights::<F>(plane);
            } else {
                let line = planes as *const __m256i;
                for (j, vj) in v.iter_mut().enumerate() {
                    *vj = _mm256_load_si256(line.add(8 * b + j));
                }
            }
            if has_min {
                // Sub-block scales, 0..=63.
                let sc = bytes8(hdr.add(32 + 8 * bi), false);
                each_row!(MT, i, {
                    let a = r.q[i].add(b * QK);
                    let d = if F == Q4K {
                        D::q4k(&v, a, sc)
                    } else {
                        D::q5k(&v, a, sc)
                    };
                    isum[i] = _mm256_add_epi32(isum[i], d);
                });
            } else if F == Q2K {
                // A byte per half block, the scale (0..=15) below the min: the scales times
                // the half dots, the mins times the half sums.
                let x0 = bytes8(hdr.add(32 + 16 * bi), false);
                let x1 = bytes8(hdr.add(40 + 16 * bi), false);
                let m15 = _mm256_set1_epi32(15);
                let (s0, s1) = (_mm256_and_si256(x0, m15), _mm256_and_si256(x1, m15));
                let mp = pairs(_mm256_srli_epi32(x0, 4), _mm256_srli_epi32(x1, 4));
                each_row!(MT, i, {
                    let h = D::q6k(&v, r.q[i].add(b * QK), s0, s1);
                    isum[i] = _mm256_add_epi32(isum[i], h);
                    let hs = _mm256_set1_epi32(*r.hpair[i].add(b));
                    msum[i] = _mm256_add_epi32(msum[i], _mm256_madd_epi16(mp, hs));
                });
            } else if F == IQ4XS {
                // Signed block scales and values: the block dot as q8_0's, times the scale.
                let sc = bytes8(hdr.add(16 + 8 * bi), true);
                let q = D::q8_prep(&v);
                each_row!(MT, i, {
                    let d = D::q8s(&v, &q, r.q[i].add(b * QK), *r.bsum[i].add(b), sc);
                    isum[i] = _mm256_add_epi32(isum[i], d);
                });
            } else {
                // q6_K, q3_K: half-block scales s0, s1 scale the half sums, the pair (s0, s1)
                // the zero-point correction.
                let s0 = bytes8(hdr.add(16 + 16 * bi), true);
                let s1 = bytes8(hdr.add(24 + 16 * bi), true);
                let sc01 = pairs(s0, s1);
                each_row!(MT, i, {
                    // s0 * h0 + s1 * h1 - z * (s0 * hs0 + s1 * hs1), z 32 or 4, exact i32.
                    let h = D::q6k(&v, r.q[i].add(b * QK), s0, s1);
                    let hs = _mm256_set1_epi32(*r.hpair[i].add(b));
                    let m = _mm256_madd_epi16(sc01, hs);
                    let corr = if F == Q3K {
                        _mm256_slli_epi32(m, 2)
                    } else {
                        _mm256_slli_epi32(m, 5)
                    };
                    isum[i] = _mm256_add_epi32(isum[i], _mm256_sub_epi32(h, corr));
                });
            }
        }
        let wd = half8(hdr);
        if has_min {
            // Mins (0..=63) of blocks 2p and 2p + 1 as i16 pairs against the pair of block sums.
            for p in 0..bps / 2 {
                let m0 = bytes8(hdr.add(96 + 16 * p), false);
                let m1 = bytes8(hdr.add(104 + 16 * p), false);
                let mp = pairs(m0, m1);
                each_row!(MT, i, {
                    let bp = _mm256_set1_epi32(*r.bpair[i].add(s * bps / 2 + p));
                    msum[i] = _mm256_add_epi32(msum[i], _mm256_madd_epi16(mp, bp));
                });
            }
        }
        if mins {
            let wm = _mm256_xor_ps(half8(hdr.add(16)), _mm256_set1_ps(-0.0));
            each_row!(MT, i, {
                let da = _mm256_set1_ps(*r.d[i].add(s));
                let t = _mm256_mul_ps(_mm256_mul_ps(wd, da), _mm256_cvtepi32_ps(isum[i]));
                let tm = _mm256_mul_ps(_mm256_mul_ps(wm, da), _mm256_cvtepi32_ps(msum[i]));
                let lane = &mut acc[i][s % 8];
                *lane = _mm256_add_ps(*lane, _mm256_add_ps(t, tm));
            });
        } else {
            each_row!(MT, i, {
                let da = _mm256_set1_ps(*r.d[i].add(s));
                let t = _mm256_mul_ps(_mm256_mul_ps(wd, da), _mm256_cvtepi32_ps(isum[i]));
                let lane = &mut acc[i][s % 8];
                *lane = _mm256_add_ps(*lane, t);
            });
        }
    }
    store(&acc, out, ldo, cols);
}
