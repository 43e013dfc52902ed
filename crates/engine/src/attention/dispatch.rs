//! Which kernel takes a set of queries: the x86 kernels (`x86/`) where the CPU has them and
//! the head size is whole sixteens, Advanced SIMD (`arm/`) on aarch64, else the scalar
//! reference. Every choice gives the same bits.

use half::f16;
use half::slice::HalfFloatSliceExt;

#[cfg(target_arch = "x86_64")]
use super::x86::avx2::{attend8, attend_avx2};
use super::{attend_impl, fold_scalar, State};

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
        return unsafe { super::arm::neon::widen(src, dst) };
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
        return super::x86::wide::sets_for(d);
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
    if super::arm::neon::usable(st) {
        let d = st.dim;
        // SAFETY: Advanced SIMD present, the head size whole sixteens (`usable`); the
        // kernels check that the keys and values hold `n` rows.
        unsafe {
            match kv {
                Kv::F16(k, v) => {
                    assert!(k.len() >= n * d && v.len() >= n * d);
                    super::arm::neon::attend(st, q, k, v, n)
                }
                Kv::F32(k, v) => super::arm::neon::fold(st, q, k, v, n),
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
    let (lanes, d) = (super::x86::wide::LANES, states[0].dim);
    let whole = states.len() / lanes * lanes;
    let step = lanes * super::x86::wide::sets_for(d);
    for at in (0..whole).step_by(step) {
        let end = whole.min(at + step);
        wide16::<H>(&mut states[at..end], &r[at * d..end * d], k, v, n);
    }
    let (st, r) = (&mut states[whole..], &r[whole * d..]);
    if st.is_empty() || (H && st.len() <= 2) {
        return whole;
    }
    match d {
        64 => super::x86::few::attend_few::<64, H>(st, r, k, v, n),
        128 => super::x86::few::attend_few::<128, H>(st, r, k, v, n),
        256 => super::x86::few::attend_few::<256, H>(st, r, k, v, n),
        _ => super::x86::few::attend_few::<0, H>(st, r, k, v, n),
    }
    states.len()
}

/// `attend16` with the head size known at compile time where it is common.
///
/// # Safety
/// As `attend16`.
#[cfg(target_arch = "x86_64")]
unsafe fn wide16<const H: bool>(st: &mut [State], r: &[f32], k: *const u8, v: *const u8, n: usize) {
    match st[0].dim {
        64 => super::x86::wide::attend16::<64, H>(st, r, k, v, n),
        128 => super::x86::wide::attend16::<128, H>(st, r, k, v, n),
        _ => super::x86::wide::attend16::<0, H>(st, r, k, v, n),
    }
}

/// How many leading states `sixteens_over` takes: the whole sixteens on AVX-512, none
/// elsewhere.
pub fn wide_lead(states: &[State]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::LEVEL.wide() && states.first().is_some_and(fast) {
        return states.len() / super::x86::wide::LANES * super::x86::wide::LANES;
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
        let step = super::x86::wide::LANES * super::x86::wide::sets_for(d);
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
