//! The GEMM over repacked groups (`repack.rs`) on Advanced SIMD: a tile is one group (8
//! weight rows) x up to 8 activation rows. Per 32-block, each 32-byte weight chunk (4 values
//! of each of the 8 rows, `4r + t`) is unpacked once into two 16-byte vectors (rows 0-3 and
//! 4-7) and multiplied against every activation row's 4 values (`Dots`), so the 8 rows' exact
//! integer block dots come out in two `int32x4` with no horizontal reduction:
//!
//! - ARMv8.0: `smull` widening products summed in i16 lanes (in ranges that cannot
//!   overflow), then pairwise into i32;
//! - dotprod: `sdot` by element, the activation's 4 bytes picked from a register by lane;
//! - i8mm: `smmla` on pairs of activation rows, the weights zipped to 8 values of a row pair
//!   per vector (2 x 8 by 8 x 2 into a 2 x 2 block of i32), a single row by `sdot`.
//!
//! Weights are unsigned except q8_0's and all multiply signed (values below 64 fit), so there
//! is no bias to undo; zero points (q4_0: 8, q5_0: 16, q6_K: 32) are corrected exactly by the
//! activation block sums. The float part is the canonical one of `portable.rs`: `(wd * ad) *
//! isum (+ wm * as)` per scale block as separate multiplies and adds (no fused ones), added
//! into lane `term % 8` and reduced by the same tree, so every output has the portable bits.
//!
//! `sdot`, `smmla` and the f16 widening are written with `asm!`: their intrinsics are not
//! stable in Rust yet.

// Lane and sub-block indices are the layout; index loops say it most plainly.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::arch::asm;

use crate::kernels::act_quant::Acts;
use crate::kernels::formats::{Bits, Plane};
use crate::kernels::repack::ROWS;
pub(crate) use crate::kernels::tile::{tile_rows, Tile};
use crate::kernels::{Format, IQ4, QK};

/// A tile kernel of one level.
pub(crate) type TileFn = unsafe fn(&Tile);

/// The tile by ARMv8.0 widening multiplies.
///
/// # Safety
/// `t.group` is a whole repacked group of `t.f` for `t.acts.nb` blocks; `t.out` has room for
/// `t.mt` rows of `t.cols` columns at stride `t.ldo`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn tile_neon(t: &Tile) {
    tile::<Widen>(t)
}

/// As `tile_neon`, the integer dots by `sdot`.
///
/// # Safety
/// As `tile_neon`, and the dotprod extension present.
#[target_feature(enable = "neon,dotprod")]
pub(crate) unsafe fn tile_dotprod(t: &Tile) {
    tile::<Sdot>(t)
}

/// As `tile_dotprod`, pairs of activation rows by `smmla`.
///
/// # Safety
/// As `tile_dotprod`, and the i8mm extension present.
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(crate) unsafe fn tile_i8mm(t: &Tile) {
    tile::<Smmla>(t)
}

use crate::kernels::formats::code::*;

#[inline(always)]
unsafe fn tile<D: Dots>(t: &Tile) {
    let Tile {
        f,
        group,
        acts,
        i0,
        mt,
        out,
        ldo,
        cols,
        prefetch,
    } = *t;
    macro_rules! go {
        ($kernel:ident, $c:expr) => {
            match mt {
                1 => $kernel::<D, $c, 1>(group, acts, i0, out, ldo, cols, prefetch),
                2 => $kernel::<D, $c, 2>(group, acts, i0, out, ldo, cols, prefetch),
                4 => $kernel::<D, $c, 4>(group, acts, i0, out, ldo, cols, prefetch),
                _ => $kernel::<D, $c, 8>(group, acts, i0, out, ldo, cols, prefetch),
            }
        };
    }
    match f {
        Format::Q4_0 => go!(tile_n, Q4_0),
        Format::Q4_1 => go!(tile_n, Q4_1),
        Format::Q5_0 => go!(tile_n, Q5_0),
        Format::Q5_1 => go!(tile_n, Q5_1),
        Format::Q8_0 => go!(tile_n, Q8_0),
        Format::Q4K => go!(tile_k, Q4K),
        Format::Q5K => go!(tile_k, Q5K),
        Format::Q6K => go!(tile_k, Q6K),
        Format::IQ4NL => go!(tile_n, IQ4NL),
        Format::IQ4XS => go!(tile_k, IQ4XS),
        Format::Q3K => go!(tile_k, Q3K),
        Format::Q2K => go!(tile_k, Q2K),
    }
}

/// One 32-byte weight chunk: rows 0-3 and rows 4-7, 4 values each (`4r + t`).
type Chunk = [int8x16_t; 2];

/// Two i32 lanes per weight row: rows 0-3 and rows 4-7.
type Rows8 = [int32x4_t; 2];

/// The exact integer dots of chunks `from..to` of one 32-block's weights `v` (`weights`)
/// and `MT` activation rows, per instruction set.
trait Dots {
    /// The weights in the form the dots read, made once per block for all rows.
    type W;
    /// The most chunks of q6_K (values 0..=63) and of q8_0 (-128..=127) one call may sum:
    /// the widening path keeps single products in i16 lanes.
    const SPAN_Q6: usize;
    const SPAN_Q8: usize;
    unsafe fn prep(v: &[Chunk; 8]) -> Self::W;
    /// `a[i]`: row `i`'s 32 values of this block; chunks `FROM..TO` (constants, so every
    /// loop over them unrolls).
    unsafe fn dots<const MT: usize, const FROM: usize, const TO: usize>(
        w: &Self::W,
        a: &[*const i8; MT],
    ) -> [Rows8; MT];
}

/// ARMv8.0: `smull` products summed in i16 lanes (a lane holds one row's products at one of
/// its 4 value positions), then `saddlp` and `addp` into the rows' i32 lanes.
struct Widen;

/// `sdot` by element.
struct Sdot;

/// `smmla` on activation row pairs.
struct Smmla;

/// Activation values `4j..4j + 4` of a 32-block as one i32 broadcast to all lanes.
#[inline(always)]
unsafe fn bcast(a: *const i8, j: usize) -> int8x16_t {
    vreinterpretq_s8_s32(vdupq_n_s32(std::ptr::read_unaligned(
        a.add(4 * j) as *const i32
    )))
}

impl Dots for Widen {
    type W = [Chunk; 8];
    // 4 * 63 * 127 and 2 * 128 * 127 fit in i16; q4 (8 * 15 * 127) and q5 (8 * 31 * 127) too.
    const SPAN_Q6: usize = 4;
    const SPAN_Q8: usize = 2;

    #[inline(always)]
    unsafe fn prep(v: &[Chunk; 8]) -> Self::W {
        *v
    }

    #[inline(always)]
    unsafe fn dots<const MT: usize, const FROM: usize, const TO: usize>(
        w: &Self::W,
        a: &[*const i8; MT],
    ) -> [Rows8; MT] {
        std::array::from_fn(|i| {
            let mut acc = [[vdupq_n_s16(0); 2]; 2];
            for j in FROM..TO {
                let x = bcast(a[i], j);
                for h in 0..2 {
                    let lo = vmull_s8(vget_low_s8(w[j][h]), vget_low_s8(x));
                    let hi = vmull_high_s8(w[j][h], x);
                    acc[h][0] = vaddq_s16(acc[h][0], lo);
                    acc[h][1] = vaddq_s16(acc[h][1], hi);
                }
            }
            // [r0 t0..t3, r1 t0..t3] and [r2.., r3..] -> i32 pair sums -> rows' i32 (the
            // pairs are widened first: two i16 lanes may sum past i16).
            std::array::from_fn(|h| vpaddq_s32(vpaddlq_s16(acc[h][0]), vpaddlq_s16(acc[h][1])))
        })
    }
}

/// `acc += w . a[4 * lane..4 * lane + 4]` in each i32 lane (`sdot`, by element).
#[inline(always)]
unsafe fn sdot<const LANE: i32>(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        // The assembler takes no features from the function: name the extension here.
        ".arch_extension dotprod",
        "sdot {acc:v}.4s, {w:v}.16b, {a:v}.4b[{lane}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        lane = const LANE,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The `sdot` chains of chunks `from..to` for one activation row (both 16-byte halves of
/// the block loaded once).
#[inline(always)]
unsafe fn sdot_row<const FROM: usize, const TO: usize>(w: &[Chunk; 8], a: *const i8) -> Rows8 {
    let x = [vld1q_s8(a), vld1q_s8(a.add(16))];
    let mut acc = [vdupq_n_s32(0); 2];
    // Spelled out: LLVM does not unroll loops around `asm!`, and the lane is a constant.
    macro_rules! chunk {
        ($j:literal, $lane:literal) => {
            if FROM <= $j && $j < TO {
                acc[0] = sdot::<$lane>(acc[0], w[$j][0], x[$j / 4]);
                acc[1] = sdot::<$lane>(acc[1], w[$j][1], x[$j / 4]);
            }
        };
    }
    chunk!(0, 0);
    chunk!(1, 1);
    chunk!(2, 2);
    chunk!(3, 3);
    chunk!(4, 0);
    chunk!(5, 1);
    chunk!(6, 2);
    chunk!(7, 3);
    acc
}

impl Dots for Sdot {
    type W = [Chunk; 8];
    const SPAN_Q6: usize = 8;
    const SPAN_Q8: usize = 8;

    #[inline(always)]
    unsafe fn prep(v: &[Chunk; 8]) -> Self::W {
        *v
    }

    #[inline(always)]
    unsafe fn dots<const MT: usize, const FROM: usize, const TO: usize>(
        w: &Self::W,
        a: &[*const i8; MT],
    ) -> [Rows8; MT] {
        std::array::from_fn(|i| sdot_row::<FROM, TO>(w, a[i]))
    }
}

/// `acc += w (2 x 8) . a (2 x 8)^T` as a row-major 2 x 2 block of i32 (`smmla`).
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        ".arch_extension i8mm",
        "smmla {acc:v}.4s, {w:v}.16b, {a:v}.16b",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// The weights for `smmla`: `z[p][q]` holds rows `2q` and `2q + 1`, values `8p..8p + 8`
/// each, made by zipping chunks `2p` and `2p + 1` word by word; `v` stays for single rows.
struct Zipped {
    v: [Chunk; 8],
    z: [[int8x16_t; 4]; 4],
}

impl Dots for Smmla {
    type W = Zipped;
    const SPAN_Q6: usize = 8;
    const SPAN_Q8: usize = 8;

    #[inline(always)]
    unsafe fn prep(v: &[Chunk; 8]) -> Self::W {
        let word = |x: int8x16_t| vreinterpretq_s32_s8(x);
        let z = std::array::from_fn(|p| {
            let (c0, c1) = (v[2 * p], v[2 * p + 1]);
            std::array::from_fn(|q| {
                let (x, y) = (word(c0[q / 2]), word(c1[q / 2]));
                vreinterpretq_s8_s32(if q % 2 == 0 {
                    vzip1q_s32(x, y)
                } else {
                    vzip2q_s32(x, y)
                })
            })
        });
        Zipped { v: *v, z }
    }

    #[inline(always)]
    unsafe fn dots<const MT: usize, const FROM: usize, const TO: usize>(
        w: &Self::W,
        a: &[*const i8; MT],
    ) -> [Rows8; MT] {
        let mut out = [[vdupq_n_s32(0); 2]; MT];
        if MT == 1 {
            out[0] = sdot_row::<FROM, TO>(&w.v, a[0]);
            return out;
        }
        // `FROM`, `TO` even: whole chunk pairs.
        for i in (0..MT).step_by(2) {
            let mut acc = [vdupq_n_s32(0); 4];
            // Spelled out, as in `sdot_row`.
            macro_rules! pair {
                ($p:literal) => {
                    if FROM / 2 <= $p && $p < TO / 2 {
                        let (lo, hi) = (a[i].add(8 * $p), a[i + 1].add(8 * $p));
                        let x = vcombine_s8(vld1_s8(lo), vld1_s8(hi));
                        acc[0] = smmla(acc[0], w.z[$p][0], x);
                        acc[1] = smmla(acc[1], w.z[$p][1], x);
                        acc[2] = smmla(acc[2], w.z[$p][2], x);
                        acc[3] = smmla(acc[3], w.z[$p][3], x);
                    }
                };
            }
            pair!(0);
            pair!(1);
            pair!(2);
            pair!(3);
            // acc[q] = [r(2q).a_i, r(2q).a_i1, r(2q+1).a_i, r(2q+1).a_i1].
            for h in 0..2 {
                let (x, y) = (acc[2 * h], acc[2 * h + 1]);
                out[i][h] = vuzp1q_s32(x, y);
                out[i + 1][h] = vuzp2q_s32(x, y);
            }
        }
        out
    }
}

/// 8 f16 -> 8 f32 (`fcvtl`, exact).
#[inline(always)]
pub(super) unsafe fn half8(p: *const u8) -> [float32x4_t; 2] {
    let h = vld1q_u16(p as *const u16);
    let (lo, hi): (float32x4_t, float32x4_t);
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags)
    );
    [lo, hi]
}

/// 8 u8 (or i8 when `signed`) -> 8 i32.
#[inline(always)]
unsafe fn bytes8(p: *const u8, signed: bool) -> Rows8 {
    let w = if signed {
        vmovl_s8(vld1_s8(p as *const i8))
    } else {
        vreinterpretq_s16_u16(vmovl_u8(vld1_u8(p)))
    };
    [vmovl_s16(vget_low_s16(w)), vmovl_high_s16(w)]
}

/// The 8 weight chunks of one 32-block: `v[j]` holds each row's values `4j..4j + 4`
/// (unsigned; q8_0 and the iq4 formats signed).
#[inline(always)]
unsafe fn weights<const F: u8>(p: *const u8) -> [Chunk; 8] {
    let ld = |i: usize| [vld1q_u8(p.add(32 * i)), vld1q_u8(p.add(32 * i + 16))];
    let s = vreinterpretq_s8_u8;
    let mut v = [[vdupq_n_s8(0); 2]; 8];
    let bits = match Format::of_code(F).plane() {
        Plane::Bytes => {
            for j in 0..8 {
                let c = ld(j);
                v[j] = [s(c[0]), s(c[1])];
            }
            return v;
        }
        Plane::TwoBit => {
            // Four 2-bit values a byte, in two chunks.
            let m2 = vdupq_n_u8(3);
            for c in 0..2 {
                for (h, x) in ld(c).into_iter().enumerate() {
                    v[4 * c][h] = s(vandq_u8(x, m2));
                    v[4 * c + 1][h] = s(vandq_u8(vshrq_n_u8::<2>(x), m2));
                    v[4 * c + 2][h] = s(vandq_u8(vshrq_n_u8::<4>(x), m2));
                    v[4 * c + 3][h] = s(vshrq_n_u8::<6>(x));
                }
            }
            return v;
        }
        Plane::Split(bits) => bits,
    };
    let c: [[uint8x16_t; 2]; 4] = std::array::from_fn(ld);
    for j in 0..4 {
        for h in 0..2 {
            let (lo, hi) = match bits {
                // Low 5 bits, then 3 bits above them and 2 from chunk 4 (`repack.rs`).
                Bits::Five => {
                    let c4 = ld(4)[h];
                    let top = match j {
                        0 => c4,
                        1 => vshrq_n_u8::<2>(c4),
                        2 => vshrq_n_u8::<4>(c4),
                        _ => vshrq_n_u8::<6>(c4),
                    };
                    let hi = vsliq_n_u8::<3>(vshrq_n_u8::<5>(c[j][h]), top);
                    (
                        vandq_u8(c[j][h], vdupq_n_u8(0x1F)),
                        vandq_u8(hi, vdupq_n_u8(0x1F)),
                    )
                }
                // Low 6 bits, then 2 bits above them and a nibble of chunk 4 or 5.
                Bits::Six => {
                    let c45 = ld(4 + j / 2)[h];
                    let nib = if j % 2 == 0 {
                        c45
                    } else {
                        vshrq_n_u8::<4>(c45)
                    };
                    let hi = vsliq_n_u8::<2>(vshrq_n_u8::<6>(c[j][h]), nib);
                    (
                        vandq_u8(c[j][h], vdupq_n_u8(0x3F)),
                        vandq_u8(hi, vdupq_n_u8(0x3F)),
                    )
                }
                Bits::Four => (
                    vandq_u8(c[j][h], vdupq_n_u8(0x0F)),
                    vshrq_n_u8::<4>(c[j][h]),
                ),
            };
            v[j][h] = s(lo);
            v[j + 4][h] = s(hi);
        }
    }
    if F == IQ4NL || F == IQ4XS {
        // The values by index (`tbl`).
        let t = vld1q_s8(IQ4.as_ptr());
        for x in v.iter_mut().flatten() {
            *x = vqtbl1q_s8(t, vreinterpretq_u8_s8(*x));
        }
    }
    v
}

/// Least distance streaming calls prefetch ahead.
const AHEAD: usize = 12 << 10;

/// Prefetches `bytes` of the run of groups at `base`, `at` into it, a tile (`tile` bytes,
/// at least `AHEAD`) ahead: decode streams the weights from memory once.
#[inline(always)]
unsafe fn prefetch_run(base: *const u8, tile: usize, at: usize, bytes: usize) {
    let p = base.wrapping_add(at + tile.max(AHEAD));
    for line in (0..bytes).step_by(64) {
        asm!(
            "prfm pldl1keep, [{p}]",
            p = in(reg) p.wrapping_add(line),
            options(nostack, readonly, preserves_flags)
        );
    }
}

/// `a + b` lane by lane, for both halves.
#[inline(always)]
unsafe fn add2(a: Rows8, b: Rows8) -> Rows8 {
    [vaddq_s32(a[0], b[0]), vaddq_s32(a[1], b[1])]
}

/// The dots of chunks `FROM..TO` (a half or the whole block) in calls of at most `span`
/// chunks (2, 4 or 8), summed in i32.
#[inline(always)]
unsafe fn dots_by<D: Dots, const MT: usize, const FROM: usize, const TO: usize>(
    w: &D::W,
    a: &[*const i8; MT],
    span: usize,
) -> [Rows8; MT] {
    let sum = |x: [Rows8; MT], y: [Rows8; MT]| -> [Rows8; MT] {
        std::array::from_fn(|i| add2(x[i], y[i]))
    };
    match (FROM, TO) {
        (0, 8) if span < 4 => sum(
            sum(D::dots::<MT, 0, 2>(w, a), D::dots::<MT, 2, 4>(w, a)),
            sum(D::dots::<MT, 4, 6>(w, a), D::dots::<MT, 6, 8>(w, a)),
        ),
        (0, 8) if span < 8 => sum(D::dots::<MT, 0, 4>(w, a), D::dots::<MT, 4, 8>(w, a)),
        (0, 4) if span < 4 => sum(D::dots::<MT, 0, 2>(w, a), D::dots::<MT, 2, 4>(w, a)),
        (4, 8) if span < 4 => sum(D::dots::<MT, 4, 6>(w, a), D::dots::<MT, 6, 8>(w, a)),
        _ => D::dots::<MT, FROM, TO>(w, a),
    }
}

/// The 32-block formats.
#[inline(always)]
unsafe fn tile_n<D: Dots, const F: u8, const MT: usize>(
    group: &[u8],
    acts: &Acts,
    i0: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
    prefetch: bool,
) {
    let f = Format::of_code(F);
    let has_min = F == Q4_1 || F == Q5_1;
    let zero_point = f.zero_point();
    let span = if F == Q8_0 || F == IQ4NL {
        D::SPAN_Q8
    } else {
        8
    };
    let (hb, sb) = (f.header_bytes(), f.super_bytes());
    let r = acts.rows::<MT>(i0);
    let mut acc = [[[vdupq_n_f32(0.0); 2]; 8]; MT];
    let gp = group.as_ptr();
    for b in 0..acts.nb {
        let hdr = gp.add(b * sb);
        let wd = half8(hdr);
        let wm = if has_min { half8(hdr.add(16)) } else { wd };
        let w = D::prep(&weights::<F>(hdr.add(hb)));
        if MT == 1 || prefetch {
            prefetch_run(gp, group.len(), b * sb, sb);
        }
        let a: [*const i8; MT] = std::array::from_fn(|i| r.q[i].add(b * QK));
        let dots = dots_by::<D, MT, 0, 8>(&w, &a, span);
        for i in 0..MT {
            let corr = vdupq_n_s32(zero_point * *r.bsum[i].add(b));
            let da = vdupq_n_f32(*r.d[i].add(b));
            for h in 0..2 {
                let isum = vsubq_s32(dots[i][h], corr);
                let mut t = vmulq_f32(vmulq_f32(wd[h], da), vcvtq_f32_s32(isum));
                if has_min {
                    t = vaddq_f32(t, vmulq_f32(wm[h], vdupq_n_f32(*r.s[i].add(b))));
                }
                let lane = &mut acc[i][b % 8][h];
                *lane = vaddq_f32(*lane, t);
            }
        }
    }
    store(&acc, out, ldo, cols);
}

/// q4_K, q5_K, q6_K and iq4_xs: per super block, each 32-block's dot is scaled by its integer
/// sub-block scales and summed in i32 (`isum`); q4_K's and q5_K's mins give `msum` = sum of `min * block sum`.
/// One float term per super block: `(wd * ad) * isum (+ (wm * ad) * msum)`.
#[inline(always)]
unsafe fn tile_k<D: Dots, const F: u8, const MT: usize>(
    group: &[u8],
    acts: &Acts,
    i0: usize,
    out: *mut f32,
    ldo: usize,
    cols: usize,
    prefetch: bool,
) {
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
    let r = acts.rows::<MT>(i0);
    let mut acc = [[[vdupq_n_f32(0.0); 2]; 8]; MT];
    let gp = group.as_ptr();
    for s in 0..acts.ns {
        let hdr = gp.add(s * sb);
        let mut isum = [[vdupq_n_s32(0); 2]; MT];
        let mut msum = [[vdupq_n_s32(0); 2]; MT];
        for bi in 0..bps {
            let b = s * bps + bi;
            if MT == 1 || prefetch {
                let per = sb / bps;
                prefetch_run(gp, group.len(), s * sb + bi * per, per);
            }
            let w = D::prep(&weights::<F>(hdr.add(hb + bi * pb)));
            let a: [*const i8; MT] = std::array::from_fn(|i| r.q[i].add(b * QK));
            if has_min {
                // q4_K, q5_K: sub-block scales, 0..=63 (eight 5-bit chunks fit the i16 lanes).
                let sc = bytes8(hdr.add(32 + 8 * bi), false);
                let d = D::dots::<MT, 0, 8>(&w, &a);
                for i in 0..MT {
                    for h in 0..2 {
                        isum[i][h] = vmlaq_s32(isum[i][h], d[i][h], sc[h]);
                    }
                }
            } else if F == Q2K {
                // A byte per half block, the scale (0..=15) below the min: the scales times
                // the half dots, the mins times the half sums.
                let (x0, x1) = (
                    bytes8(hdr.add(32 + 16 * bi), false),
                    bytes8(hdr.add(40 + 16 * bi), false),
                );
                let d0 = dots_by::<D, MT, 0, 4>(&w, &a, D::SPAN_Q6);
                let d1 = dots_by::<D, MT, 4, 8>(&w, &a, D::SPAN_Q6);
                let m15 = vdupq_n_s32(15);
                for i in 0..MT {
                    let hp = *r.hpair[i].add(b);
                    let (hs0, hs1) = (hp as i16 as i32, hp >> 16);
                    for h in 0..2 {
                        let t = vmulq_s32(vandq_s32(x0[h], m15), d0[i][h]);
                        isum[i][h] =
                            vaddq_s32(isum[i][h], vmlaq_s32(t, vandq_s32(x1[h], m15), d1[i][h]));
                        let m = vmulq_n_s32(vshrq_n_s32::<4>(x0[h]), hs0);
                        msum[i][h] =
                            vaddq_s32(msum[i][h], vmlaq_n_s32(m, vshrq_n_s32::<4>(x1[h]), hs1));
                    }
                }
            } else if F == IQ4XS {
                // Signed block scales and values (the widening path sums them as q8_0's).
                let sc = bytes8(hdr.add(16 + 8 * bi), true);
                let d = dots_by::<D, MT, 0, 8>(&w, &a, D::SPAN_Q8);
                for i in 0..MT {
                    for h in 0..2 {
                        isum[i][h] = vmlaq_s32(isum[i][h], d[i][h], sc[h]);
                    }
                }
            } else {
                // Half-block scales: s0 * (h0 - z * hs0) + s1 * (h1 - z * hs1), the zero point
                // z 32 (q6_K) or 4 (q3_K), exact i32.
                let s0 = bytes8(hdr.add(16 + 16 * bi), true);
                let s1 = bytes8(hdr.add(24 + 16 * bi), true);
                let d0 = dots_by::<D, MT, 0, 4>(&w, &a, D::SPAN_Q6);
                let d1 = dots_by::<D, MT, 4, 8>(&w, &a, D::SPAN_Q6);
                for i in 0..MT {
                    let hp = *r.hpair[i].add(b);
                    let z = if F == Q3K { 4 } else { 32 };
                    let c0 = vdupq_n_s32(z * (hp as i16 as i32));
                    let c1 = vdupq_n_s32(z * (hp >> 16));
                    for h in 0..2 {
                        let t = vmulq_s32(s0[h], vsubq_s32(d0[i][h], c0));
                        let t = vmlaq_s32(t, s1[h], vsubq_s32(d1[i][h], c1));
                        isum[i][h] = vaddq_s32(isum[i][h], t);
                    }
                }
            }
        }
        let wd = half8(hdr);
        if has_min {
            // Mins (0..=63) of each block times the block's activation sum.
            for bi in 0..bps {
                let m = bytes8(hdr.add(96 + 8 * bi), false);
                for i in 0..MT {
                    let bsum = *r.bsum[i].add(s * bps + bi);
                    for h in 0..2 {
                        msum[i][h] = vmlaq_n_s32(msum[i][h], m[h], bsum);
                    }
                }
            }
        }
        if mins {
            let dm = half8(hdr.add(16));
            for i in 0..MT {
                let da = vdupq_n_f32(*r.d[i].add(s));
                for h in 0..2 {
                    let t = vmulq_f32(vmulq_f32(wd[h], da), vcvtq_f32_s32(isum[i][h]));
                    let wm = vnegq_f32(dm[h]);
                    let tm = vmulq_f32(vmulq_f32(wm, da), vcvtq_f32_s32(msum[i][h]));
                    let lane = &mut acc[i][s % 8][h];
                    *lane = vaddq_f32(*lane, vaddq_f32(t, tm));
                }
            }
        } else {
            for i in 0..MT {
                let da = vdupq_n_f32(*r.d[i].add(s));
                for h in 0..2 {
                    let t = vmulq_f32(vmulq_f32(wd[h], da), vcvtq_f32_s32(isum[i][h]));
                    let lane = &mut acc[i][s % 8][h];
                    *lane = vaddq_f32(*lane, t);
                }
            }
        }
    }
    store(&acc, out, ldo, cols);
}

/// The canonical lane reduction of each row's accumulators, stored to `cols` columns.
#[inline(always)]
unsafe fn store<const MT: usize>(
    acc: &[[[float32x4_t; 2]; 8]; MT],
    out: *mut f32,
    ldo: usize,
    cols: usize,
) {
    for (i, l) in acc.iter().enumerate() {
        let r: [float32x4_t; 2] = std::array::from_fn(|h| {
            vaddq_f32(
                vaddq_f32(vaddq_f32(l[0][h], l[4][h]), vaddq_f32(l[2][h], l[6][h])),
                vaddq_f32(vaddq_f32(l[1][h], l[5][h]), vaddq_f32(l[3][h], l[7][h])),
            )
        });
        let dst = out.add(i * ldo);
        if cols >= ROWS {
            vst1q_f32(dst, r[0]);
            vst1q_f32(dst.add(4), r[1]);
        } else {
            let mut tmp = [0f32; ROWS];
            vst1q_f32(tmp.as_mut_ptr(), r[0]);
            vst1q_f32(tmp.as_mut_ptr().add(4), r[1]);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, cols);
        }
    }
}
