use super::batch::*;
use super::*;
use crate::kv::LayerKv;
use half::slice::HalfFloatSliceExt;

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
        dispatch::attend_many(&mut many, &rows, dispatch::Kv::F32(&kf, &vf), n);
        let mut direct: Vec<State> = (0..7).map(|_| State::new(d)).collect();
        dispatch::attend_many(&mut direct, &rows, dispatch::Kv::F16(&k, &v), n);
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
        dispatch::attend_many(&mut many, &rows, dispatch::Kv::F32(&kf, &vf), half);
        dispatch::attend_many(
            &mut many,
            &rows,
            dispatch::Kv::F32(&kf[half * d..], &vf[half * d..]),
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
        (21, 512, true),
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
        (19, 512, false),
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
                dispatch::attend_many(&mut f32s, &rows, dispatch::Kv::F32(kl, vl), hi - lo);
                let (kl, vl) = (&k[lo * d..hi * d], &v[lo * d..hi * d]);
                dispatch::attend_many(&mut f16s, &rows, dispatch::Kv::F16(kl, vl), hi - lo);
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
    fn make<'a>(pre: [&'a LayerKv; 3], privs: &'a [LayerKv], rows: &[usize]) -> Vec<KvView<'a>> {
        (0..3)
            .map(|i| KvView {
                prefix: Some(pre[i]),
                private: &privs[i],
                rows: rows[i],
                after: 0,
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
            after: 0,
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
            after: 0,
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
            after: 0,
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
            after: 0,
        };
        let mut alone = vec![0f32; w];
        attend_batch(&q[i * w..(i + 1) * w], &[v], n_head, d, None, &mut alone);
        let bits = |x: &[f32]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all[i * w..(i + 1) * w]), bits(&alone), "sequence {i}");
    }
    for (n, d, queries) in [
        (90, 64, 53),
        (45, 128, 40),
        (20, 256, 33),
        (17, 512, 21),
        (37, 48, 49),
    ] {
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
                after: 0,
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
        after: 0,
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
