//! The portable kernels: the canonical scalar block dot on GGUF rows unpacked one by one (the
//! reference every path is tested against, bit for bit; see mod.rs), and the tiled GEMM in
//! plain Rust that CPUs with no SIMD path run (`run_groups`).

use super::act_quant::Acts;
use super::formats::{f16_at, Bits, Plane, IQ4};
use super::repack::ROWS;
use super::{Format, QMatrix, ACT_CHUNK, QK};
#[cfg(test)]
use super::{QuantRow, Unpacked};

/// Block `b`'s float contribution given its exact integer dot product.
#[cfg(test)]
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

/// Exact integer dot of half block `h` (16 values) of 32-block `b`.
#[cfg(test)]
#[inline(always)]
fn half(w: &Unpacked, a: &QuantRow, b: usize, h: usize) -> i32 {
    let r = b * QK + h * 16..b * QK + (h + 1) * 16;
    w.q[r.clone()]
        .iter()
        .zip(&a.q[r])
        .map(|(&x, &y)| x as i32 * y as i32)
        .sum()
}

/// The canonical dot of one weight row and one activation row (`a` quantized with
/// `f.act_block()`): one float term per scale block into lane `term % 8`, lanes reduced by a
/// fixed tree.
#[cfg(test)]
pub(super) fn dot_scalar(w: &Unpacked, a: &QuantRow, f: Format) -> f32 {
    let mut lanes = [0f32; 8];
    if f.is_k() {
        // Per super block: the scaled block dots and the mins' correction, both exact i32.
        let per = f.block_values() / QK;
        for s in 0..w.nb / per {
            let (mut isum, mut msum) = (0i32, 0i32);
            for b in s * per..(s + 1) * per {
                isum += w.sc[2 * b] * half(w, a, b, 0) + w.sc[2 * b + 1] * half(w, a, b, 1);
                for h in 0..2 {
                    let r = b * QK + 16 * h..b * QK + 16 * (h + 1);
                    let hsum: i32 = a.q[r].iter().map(|&q| q as i32).sum();
                    msum += w.mi[2 * b + h] * hsum;
                }
            }
            let b0 = s * per;
            let mut t = (w.d[b0] * a.d[s]) * isum as f32;
            if f.has_min() {
                t += (w.m[b0] * a.d[s]) * msum as f32;
            }
            lanes[s % 8] += t;
        }
        return reduce(&lanes);
    }
    for b in 0..w.nb {
        let isum = half(w, a, b, 0) + half(w, a, b, 1);
        lanes[b % 8] += block_term(w, a, b, isum, f.has_min());
    }
    reduce(&lanes)
}

/// The portable tiled GEMM: `x86/` and `arm/`'s tile loop in plain Rust over the same repacked
/// groups and quantized rows (`Acts`), for CPUs with no SIMD path. Per 32-block the 8 weight
/// rows' chunks are unpacked once into byte arrays and dotted with each activation row in
/// fixed-size loops the compiler can vectorise for whatever target it builds; the float part
/// is `dot_scalar`'s, term by term, so the same bits.
pub(super) fn run_groups(w: &QMatrix, acts: &Acts, m: usize, g0: usize, g1: usize, dst: *mut f32) {
    let gb = w.group_bytes();
    for c0 in (0..m).step_by(ACT_CHUNK) {
        let c1 = (c0 + ACT_CHUNK).min(m);
        for g in g0..g1 {
            let group = &w.data[g * gb..(g + 1) * gb];
            let col = g * ROWS;
            let cols = (w.n - col).min(ROWS);
            let mut i = c0;
            while i < c1 {
                let mt = (c1 - i).min(TILE_ROWS);
                let mut out = [[0f32; ROWS]; TILE_ROWS];
                if w.format.is_k() {
                    tile_k(w.format, group, acts, i, &mut out[..mt]);
                } else {
                    tile_n(w.format, group, acts, i, &mut out[..mt]);
                }
                for (r, row) in out[..mt].iter().enumerate() {
                    // SAFETY: tiles write disjoint [rows, cols] blocks of the `[m, n]` output
                    // at `dst`, inside it (`matmul_tiled`).
                    unsafe {
                        let at = dst.add((i + r) * w.n + col);
                        std::ptr::copy_nonoverlapping(row.as_ptr(), at, cols);
                    }
                }
                i += mt;
            }
        }
    }
}

/// Activation rows per portable tile: each block's unpacked weights serve this many.
const TILE_ROWS: usize = 4;

/// One 32-block's weight chunks as `repack.rs` lays them out: chunk `j`, byte `4r + t` holds
/// row `r`'s value `4j + t` (values 0..16 from the low bits, 16..32 from the high bits).
type Chunks = [[i8; QK]; 8];

/// The chunks of one plane (`repack.rs`): unsigned values but q8_0's and the iq4 formats'
/// (looked up in `IQ4`).
fn unpack(f: Format, p: &[u8]) -> Chunks {
    let mut v = [[0i8; QK]; 8];
    let bits = match f.plane() {
        Plane::Bytes => {
            for (j, vj) in v.iter_mut().enumerate() {
                for (x, &b) in vj.iter_mut().zip(&p[QK * j..QK * (j + 1)]) {
                    *x = b as i8;
                }
            }
            return v;
        }
        Plane::TwoBit => {
            // 2-bit values: chunk `j / 4`, bits `2 (j % 4)`.
            for (j, vj) in v.iter_mut().enumerate() {
                for (x, &b) in vj.iter_mut().zip(&p[QK * (j / 4)..QK * (j / 4 + 1)]) {
                    *x = ((b >> (2 * (j % 4))) & 3) as i8;
                }
            }
            return v;
        }
        Plane::Split(bits) => bits,
    };
    for j in 0..4 {
        let c = &p[QK * j..QK * (j + 1)];
        let (lo, hi) = v.split_at_mut(4);
        for (k, &b) in c.iter().enumerate() {
            let (l, h) = match bits {
                Bits::Five => {
                    let top = (p[4 * QK + k] >> (2 * j)) & 3;
                    (b & 0x1F, (b >> 5) | (top << 3))
                }
                Bits::Six => {
                    let nib = (p[(4 + j / 2) * QK + k] >> (4 * (j % 2))) & 15;
                    (b & 0x3F, (b >> 6) | (nib << 2))
                }
                Bits::Four => (b & 15, b >> 4),
            };
            lo[j][k] = l as i8;
            hi[j][k] = h as i8;
        }
    }
    if matches!(f, Format::IQ4NL | Format::IQ4XS) {
        v.iter_mut().flatten().for_each(|x| *x = IQ4[*x as usize]);
    }
    v
}

/// The 8 rows' exact dots of chunks `from..to` with activation values `a` (the block's 32):
/// each chunk's 32 products (row `r`, position `t`) summed lane by lane over the chunks, in
/// fixed-size loops the compiler unrolls and vectorises, then each row's 4 lanes.
fn dots(v: &Chunks, a: &[i8], from: usize, to: usize) -> [i32; ROWS] {
    let mut acc = [[0i32; 4]; ROWS];
    for j in from..to {
        let x: [i16; 4] = std::array::from_fn(|t| a[4 * j + t] as i16);
        let w = &v[j];
        for (r, l) in acc.iter_mut().enumerate() {
            for t in 0..4 {
                // |w x| <= 128 * 127: exact in i16.
                l[t] += (w[4 * r + t] as i16 * x[t]) as i32;
            }
        }
    }
    acc.map(|l| l[0] + l[1] + l[2] + l[3])
}

/// The canonical lane reduction (`portable::reduce`) of each weight row's 8 lanes.
fn store(lanes: &[[f32; ROWS]; 8], out: &mut [f32; ROWS]) {
    for (r, o) in out.iter_mut().enumerate() {
        let l: [f32; 8] = std::array::from_fn(|k| lanes[k][r]);
        *o = reduce(&l);
    }
}

fn tile_n(f: Format, group: &[u8], acts: &Acts, i0: usize, out: &mut [[f32; ROWS]]) {
    let (hb, pb, sb) = (f.header_bytes(), f.plane_bytes(), f.super_bytes());
    let zero_point = f.zero_point();
    let mut lanes = [[[0f32; ROWS]; 8]; TILE_ROWS];
    let lanes = &mut lanes[..out.len()];
    for b in 0..acts.nb {
        let hdr = &group[b * sb..(b + 1) * sb];
        let v = unpack(f, &hdr[hb..hb + pb]);
        let wd: [f32; ROWS] = std::array::from_fn(|r| f16_at(hdr, 2 * r));
        let wm: [f32; ROWS] = std::array::from_fn(|r| f16_at(hdr, 16 + 2 * r));
        for (i, l) in lanes.iter_mut().enumerate() {
            let row = i0 + i;
            let a = &acts.q[row * acts.row_stride + b * QK..][..QK];
            let (da, bsum) = (acts.d[row * acts.ns + b], acts.bsum[row * acts.nb + b]);
            let isum = dots(&v, a, 0, 8);
            for r in 0..ROWS {
                let mut t = (wd[r] * da) * (isum[r] - zero_point * bsum) as f32;
                if f.has_min() {
                    t += wm[r] * acts.s[row * acts.ns + b];
                }
                l[b % 8][r] += t;
            }
        }
    }
    for (o, l) in out.iter_mut().zip(lanes.iter()) {
        store(l, o);
    }
}

fn tile_k(f: Format, group: &[u8], acts: &Acts, i0: usize, out: &mut [[f32; ROWS]]) {
    let (bps, hb, pb, sb) = (
        f.blocks_per_super(),
        f.header_bytes(),
        f.plane_bytes(),
        f.super_bytes(),
    );
    let mut lanes = [[[0f32; ROWS]; 8]; TILE_ROWS];
    let lanes = &mut lanes[..out.len()];
    for s in 0..acts.ns {
        let hdr = &group[s * sb..(s + 1) * sb];
        let mut isum = [[0i32; ROWS]; TILE_ROWS];
        let mut msum = [[0i32; ROWS]; TILE_ROWS];
        for bi in 0..bps {
            let b = s * bps + bi;
            let v = unpack(f, &hdr[hb + bi * pb..hb + (bi + 1) * pb]);
            for (i, (is, ms)) in isum
                .iter_mut()
                .zip(msum.iter_mut())
                .take(out.len())
                .enumerate()
            {
                let row = i0 + i;
                let a = &acts.q[row * acts.row_stride + b * QK..][..QK];
                if matches!(f, Format::Q4K | Format::Q5K) {
                    // Sub-block scales and mins, 0..=63.
                    let d = dots(&v, a, 0, 8);
                    let bsum = acts.bsum[row * acts.nb + b];
                    for r in 0..ROWS {
                        is[r] += d[r] * hdr[32 + 8 * bi + r] as i32;
                        ms[r] += hdr[96 + 8 * bi + r] as i32 * bsum;
                    }
                } else if f == Format::Q2K {
                    // Half-block scales and mins, 0..=15: a byte each, the min above.
                    let (d0, d1) = (dots(&v, a, 0, 4), dots(&v, a, 4, 8));
                    let hp = acts.hpair[row * acts.nb + b];
                    let (hs0, hs1) = (hp as i16 as i32, hp >> 16);
                    for r in 0..ROWS {
                        let (x0, x1) = (hdr[32 + 16 * bi + r] as i32, hdr[40 + 16 * bi + r] as i32);
                        is[r] += (x0 & 15) * d0[r] + (x1 & 15) * d1[r];
                        ms[r] += (x0 >> 4) * hs0 + (x1 >> 4) * hs1;
                    }
                } else if f == Format::IQ4XS {
                    // Signed block scales (i8), signed values.
                    let d = dots(&v, a, 0, 8);
                    for r in 0..ROWS {
                        is[r] += d[r] * hdr[16 + 8 * bi + r] as i8 as i32;
                    }
                } else {
                    // Half-block scales (i8): s0 * (h0 - z hs0) + s1 * (h1 - z hs1), the zero
                    // point z 32 (q6_K) or 4 (q3_K).
                    let (d0, d1) = (dots(&v, a, 0, 4), dots(&v, a, 4, 8));
                    let hp = acts.hpair[row * acts.nb + b];
                    let z = if f == Format::Q3K { 4 } else { 32 };
                    let (hs0, hs1) = (z * (hp as i16 as i32), z * (hp >> 16));
                    for r in 0..ROWS {
                        let s0 = hdr[16 + 16 * bi + r] as i8 as i32;
                        let s1 = hdr[24 + 16 * bi + r] as i8 as i32;
                        is[r] += s0 * (d0[r] - hs0) + s1 * (d1[r] - hs1);
                    }
                }
            }
        }
        let wd: [f32; ROWS] = std::array::from_fn(|r| f16_at(hdr, 2 * r));
        let wm: [f32; ROWS] = std::array::from_fn(|r| -f16_at(hdr, 16 + 2 * r));
        for (i, l) in lanes.iter_mut().enumerate() {
            let da = acts.d[(i0 + i) * acts.ns + s];
            for r in 0..ROWS {
                let mut t = (wd[r] * da) * isum[i][r] as f32;
                if f.has_min() {
                    t += (wm[r] * da) * msum[i][r] as f32;
                }
                l[s % 8][r] += t;
            }
        }
    }
    for (o, l) in out.iter_mut().zip(lanes.iter()) {
        store(l, o);
    }
}
