//! The block dot product, canonical float order (see mod.rs), AVX2 or scalar at run time.

use super::{Format, QuantRow, Unpacked, QK};

/// Unpack one weight row into `w` and write its dot with every activation row to `out`.
pub(super) fn row_dots(
    f: Format,
    row: &[u8],
    w: &mut Unpacked,
    acts: &[QuantRow],
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    match *LEVEL {
        // SAFETY: the features were detected at run time.
        Level::Avx512Vnni => return unsafe { avx512::row_dots(f, row, w, acts, out) },
        Level::Avx2 => return unsafe { avx2::row_dots(f, row, w, acts, out) },
        Level::Portable => {}
    }
    f.unpack(row, w);
    for (o, a) in out.iter_mut().zip(acts) {
        *o = dot_scalar(w, a, f.has_min());
    }
}

/// Every available path's dot product (tests compare them bit for bit).
#[cfg(test)]
pub(super) fn dots_all_paths(
    w: &Unpacked,
    a: &QuantRow,
    has_min: bool,
) -> Vec<(&'static str, f32)> {
    let half = w.sc.iter().any(|&s| s != 1);
    let mut out = vec![("portable", dot_scalar(w, a, has_min))];
    #[cfg(target_arch = "x86_64")]
    {
        if *LEVEL != Level::Portable {
            // SAFETY: detected at run time.
            out.push(("avx2", unsafe { avx2::dot(w, a, has_min, half) }));
        }
        if *LEVEL == Level::Avx512Vnni {
            let mut w2 = w.clone();
            // SAFETY: detected at run time.
            unsafe { avx512::corrections(&mut w2) };
            // SAFETY: detected at run time.
            out.push(("avx512vnni", unsafe {
                avx512::dot(&w2, a, has_min, half, false)
            }));
            out.push(("avx512vnni+offset", unsafe {
                avx512::dot(&w2, a, has_min, half, true)
            }));
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Portable,
    Avx2,
    Avx512Vnni,
}

/// The kernel path this CPU runs (detected once).
pub static LEVEL: std::sync::LazyLock<Level> = std::sync::LazyLock::new(|| {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c");
        let vnni = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni");
        if avx2 && vnni && std::env::var_os("EDGEPROMPT_NO_AVX512").is_none() {
            return Level::Avx512Vnni;
        }
        if avx2 {
            return Level::Avx2;
        }
    }
    Level::Portable
});

/// Block `b`'s float contribution given its exact integer dot product.
#[inline(always)]
fn block_term(w: &Unpacked, a: &QuantRow, b: usize, isum: i32, has_min: bool) -> f32 {
    let t = (w.d[b] * a.d[b]) * isum as f32;
    if has_min {
        t + w.m[b] * a.s[b]
    } else {
        t
    }
}

#[inline(always)]
fn reduce(lanes: &[f32; 8]) -> f32 {
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
}

fn dot_scalar(w: &Unpacked, a: &QuantRow, has_min: bool) -> f32 {
    let mut lanes = [0f32; 8];
    for b in 0..w.nb {
        let half = |h: usize| -> i32 {
            let r = b * QK + h * 16..b * QK + (h + 1) * 16;
            w.q[r.clone()]
                .iter()
                .zip(&a.q[r])
                .map(|(&x, &y)| x as i32 * y as i32)
                .sum()
        };
        let isum = w.sc[2 * b] * half(0) + w.sc[2 * b + 1] * half(1);
        lanes[b % 8] += block_term(w, a, b, isum, has_min);
    }
    reduce(&lanes)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// Exact integer dot of one 32-value block as 8 partial i32 lanes.
    /// Lanes 0-3 cover values 0-15 and lanes 4-7 values 16-31, so q6_K's two half-block
    /// scales multiply them exactly.
    #[inline(always)]
    unsafe fn block_i32(w: *const i8, a: *const i8, sc: Option<*const i32>) -> __m256i {
        let wv = _mm256_loadu_si256(w as *const __m256i);
        let av = _mm256_loadu_si256(a as *const __m256i);
        // maddubs wants an unsigned operand: |w| times a with w's sign.
        let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
        let p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
        match sc {
            None => p32,
            Some(s) => {
                let m =
                    _mm256_setr_epi32(*s, *s, *s, *s, *s.add(1), *s.add(1), *s.add(1), *s.add(1));
                _mm256_mullo_epi32(p32, m)
            }
        }
    }

    /// 16 bytes of nibbles -> 32 values (low nibbles first), ggml order.
    #[inline(always)]
    unsafe fn nib(p: *const u8) -> __m256i {
        let b = _mm_loadu_si128(p as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        _mm256_set_m128i(hi, lo)
    }

    /// One block's 32 values as signed bytes (same values as `Format::unpack`).
    #[inline(always)]
    unsafe fn load_block(f: Format, blk: *const u8) -> __m256i {
        match f {
            Format::Q8_0 => _mm256_loadu_si256(blk.add(2) as *const __m256i),
            Format::Q4_0 => _mm256_sub_epi8(nib(blk.add(2)), _mm256_set1_epi8(8)),
            Format::Q4_1 => nib(blk.add(4)),
            Format::Q4K | Format::Q6K => unreachable!("K formats unpack through Format::unpack"),
            Format::Q5_0 => {
                let qh = std::ptr::read_unaligned(blk.add(2) as *const u32);
                // Spread bit j of qh to byte j as 0x10.
                let spread = _mm256_shuffle_epi8(
                    _mm256_set1_epi32(qh as i32),
                    _mm256_setr_epi64x(
                        0,
                        0x0101_0101_0101_0101,
                        0x0202_0202_0202_0202,
                        0x0303_0303_0303_0303,
                    ),
                );
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                let hi = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
                _mm256_sub_epi8(_mm256_or_si256(nib(blk.add(6)), hi), _mm256_set1_epi8(16))
            }
        }
    }

    #[inline(always)]
    pub(super) unsafe fn unpack(f: Format, row: &[u8], w: &mut Unpacked) {
        if matches!(f, Format::Q4K | Format::Q6K) {
            // Inlined portable code, auto-vectorised under this function's AVX2.
            return f.unpack(row, w);
        }
        let bb = f.block_bytes();
        for (b, blk) in row.chunks_exact(bb).enumerate() {
            let p = blk.as_ptr();
            _mm256_storeu_si256(
                w.q.as_mut_ptr().add(b * QK) as *mut __m256i,
                load_block(f, p),
            );
            w.d[b] = f16_bits_to_f32(blk[0], blk[1]);
            if f.has_min() {
                w.m[b] = f16_bits_to_f32(blk[2], blk[3]);
            }
        }
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn row_dots(
        f: Format,
        row: &[u8],
        w: &mut Unpacked,
        acts: &[QuantRow],
        out: &mut [f32],
    ) {
        unpack(f, row, w);
        for (o, a) in out.iter_mut().zip(acts) {
            *o = dot(w, a, f.has_min(), f.has_half_scales());
        }
    }

    #[inline(always)]
    unsafe fn f16_bits_to_f32(lo: u8, hi: u8) -> f32 {
        let bits = u16::from_le_bytes([lo, hi]) as i32;
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
    }

    /// Eight blocks' partial lanes -> one vector of the eight block sums (exact).
    #[inline(always)]
    pub(super) unsafe fn sums8(v: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(v[0], v[1]);
        let h23 = _mm256_hadd_epi32(v[2], v[3]);
        let h45 = _mm256_hadd_epi32(v[4], v[5]);
        let h67 = _mm256_hadd_epi32(v[6], v[7]);
        let h0123 = _mm256_hadd_epi32(h01, h23);
        let h4567 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256(h0123, h4567, 0x20),
            _mm256_permute2x128_si256(h0123, h4567, 0x31),
        )
    }

    /// Float terms of blocks `b0..b0 + 8` from their integer sums (see `block_term`).
    #[inline(always)]
    pub(super) unsafe fn terms8(
        w: &Unpacked,
        a: &QuantRow,
        b0: usize,
        sums: __m256i,
        has_min: bool,
    ) -> __m256 {
        let scale = _mm256_mul_ps(
            _mm256_loadu_ps(w.d.as_ptr().add(b0)),
            _mm256_loadu_ps(a.d.as_ptr().add(b0)),
        );
        let t = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sums));
        if has_min {
            let m = _mm256_mul_ps(
                _mm256_loadu_ps(w.m.as_ptr().add(b0)),
                _mm256_loadu_ps(a.s.as_ptr().add(b0)),
            );
            _mm256_add_ps(t, m)
        } else {
            t
        }
    }

    /// Blocks `from..` accumulated onto `acc` (lane = block % 8), then reduced.
    #[inline(always)]
    pub(super) unsafe fn finish(
        w: &Unpacked,
        a: &QuantRow,
        has_min: bool,
        half_scales: bool,
        from: usize,
        mut acc: __m256,
    ) -> f32 {
        let nb = w.nb;
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let scp = w.sc.as_ptr();
        let mut b0 = from;
        while b0 < nb {
            // A plain loop, not a closure: closures do not inherit target features, and the
            // intrinsics would become calls. Blocks past `nb` are zero padding.
            let mut v = [_mm256_setzero_si256(); 8];
            for (i, vi) in v.iter_mut().enumerate() {
                *vi = block_i32(
                    wq.add((b0 + i) * QK),
                    aq.add((b0 + i) * QK),
                    if half_scales {
                        Some(scp.add(2 * (b0 + i)))
                    } else {
                        None
                    },
                );
            }
            let t = terms8(w, a, b0, sums8(&v), has_min);
            let sum = _mm256_add_ps(acc, t);
            let real = nb - b0;
            acc = if real >= 8 {
                sum
            } else {
                // Only the real blocks' lanes take the addition (as the portable path does).
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(real as i32), lane);
                _mm256_blendv_ps(acc, sum, _mm256_castsi256_ps(keep))
            };
            b0 += 8;
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        reduce(&lanes)
    }

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(super) unsafe fn dot(w: &Unpacked, a: &QuantRow, has_min: bool, half_scales: bool) -> f32 {
        finish(w, a, has_min, half_scales, 0, _mm256_setzero_ps())
    }
}

/// AVX-512 VNNI: `vpdpbusd` does a 64-byte block pair's products and pair sums in one
/// instruction; the integer sums are the same as AVX2's, and the float work is shared, so the
/// bits are too.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::avx2::{finish, sums8, terms8};
    use super::*;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    pub(super) unsafe fn row_dots(
        f: Format,
        row: &[u8],
        w: &mut Unpacked,
        acts: &[QuantRow],
        out: &mut [f32],
    ) {
        super::avx2::unpack(f, row, w);
        // The +128 offset needs a per-row correction pass: worth it only when several
        // activation rows share the unpacked weights. Both variants give the same integers.
        let offset = acts.len() >= 4;
        if offset {
            corrections(w);
        }
        for (o, a) in out.iter_mut().zip(acts) {
            *o = dot(w, a, f.has_min(), f.has_half_scales(), offset);
        }
    }

    /// `corr[b] = 128 * (sc0 * sum(first half) + sc1 * sum(second half))`, with `vpdpbusd`
    /// against ones doing the byte sums (integers: exact, whatever the order). Rows have an
    /// even number of (padded) blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2")]
    pub(super) unsafe fn corrections(w: &mut Unpacked) {
        let ones = _mm512_set1_epi8(1);
        let mut lanes = [0i32; 16];
        for b in (0..w.corr.len()).step_by(2) {
            let wv = _mm512_loadu_si512(w.q.as_ptr().add(b * QK) as *const _);
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wv);
            _mm512_storeu_si512(lanes.as_mut_ptr() as *mut _, p);
            for i in 0..2 {
                let l = &lanes[8 * i..8 * i + 8];
                let (h0, h1) = (l[0] + l[1] + l[2] + l[3], l[4] + l[5] + l[6] + l[7]);
                w.corr[b + i] = 128 * (w.sc[2 * (b + i)] * h0 + w.sc[2 * (b + i) + 1] * h1);
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,f16c")]
    #[inline]
    pub(super) unsafe fn dot(
        w: &Unpacked,
        a: &QuantRow,
        has_min: bool,
        half_scales: bool,
        offset: bool,
    ) -> f32 {
        let nb = w.nb;
        let (wq, aq) = (w.q.as_ptr(), a.q.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut b0 = 0;
        while b0 + 16 <= nb {
            let mut v = [_mm256_setzero_si256(); 16];
            for i in 0..8 {
                let b = b0 + 2 * i;
                let wv = _mm512_loadu_si512(wq.add(b * QK) as *const _);
                let mut p = if offset {
                    // (a + 128) * w summed exactly; the offset is removed per block below.
                    let au = _mm512_loadu_si512(a.u.as_ptr().add(b * QK) as *const _);
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), au, wv)
                } else {
                    // |w| (unsigned) times a with w's sign.
                    let av = _mm512_loadu_si512(aq.add(b * QK) as *const _);
                    let neg = _mm512_movepi8_mask(wv);
                    let aw = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), aw)
                };
                if half_scales {
                    let s = w.sc.as_ptr().add(2 * b);
                    let m = _mm512_setr_epi32(
                        *s,
                        *s,
                        *s,
                        *s,
                        *s.add(1),
                        *s.add(1),
                        *s.add(1),
                        *s.add(1),
                        *s.add(2),
                        *s.add(2),
                        *s.add(2),
                        *s.add(2),
                        *s.add(3),
                        *s.add(3),
                        *s.add(3),
                        *s.add(3),
                    );
                    p = _mm512_mullo_epi32(p, m);
                }
                v[2 * i] = _mm512_castsi512_si256(p);
                v[2 * i + 1] = _mm512_extracti64x4_epi64(p, 1);
            }
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            lo.copy_from_slice(&v[..8]);
            hi.copy_from_slice(&v[8..]);
            let (mut s_lo, mut s_hi) = (sums8(&lo), sums8(&hi));
            if offset {
                let corr = w.corr.as_ptr() as *const __m256i;
                s_lo = _mm256_sub_epi32(s_lo, _mm256_loadu_si256(corr.add(b0 / 8)));
                s_hi = _mm256_sub_epi32(s_hi, _mm256_loadu_si256(corr.add(b0 / 8 + 1)));
            }
            acc = _mm256_add_ps(acc, terms8(w, a, b0, s_lo, has_min));
            acc = _mm256_add_ps(acc, terms8(w, a, b0 + 8, s_hi, has_min));
            b0 += 16;
        }
        finish(w, a, has_min, half_scales, b0, acc)
    }
}
