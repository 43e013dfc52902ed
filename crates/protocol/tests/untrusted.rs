//! The bounded, stable-Rust pass of the fuzz target (`fuzz/fuzz_targets/wire.rs` runs the same
//! function under libFuzzer): valid seeds and 20 000 seeded mutations of them through every
//! decoder of untrusted bytes, plus any saved corpus. Passing means nothing panicked.

use std::sync::Arc;

use edgeprompt_engine::recurrent::Recurrent;
use edgeprompt_engine::{LayerKv, PrefixKv};
use edgeprompt_kv::chunk::{Chunk, Reassembler};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::untrusted::{
    expect_of, read_untrusted, shape_bytes, shape_of, state_of, SHAPE,
};
use edgeprompt_protocol::{fetch_message::Body, FetchMessage, Header};
use prost::Message;

fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *s >> 33
}

/// The shapes the seeds are made in: the small one, one past a chunk with multi-group int4
/// rows, and dims that fit no group.
const SHAPES: [(usize, usize, usize, usize); 3] = [SHAPE, (1, 300, 2, 96), (3, 40, 1, 200)];

fn layer(seed: &mut u64, shape: (usize, usize, usize, usize)) -> LayerKv {
    let (_, tokens, heads, dim) = shape;
    let mut l = LayerKv::new(heads, dim);
    let mut v = || {
        (0..tokens * heads * dim)
            .map(|_| (lcg(seed) % 2000) as f32 / 500.0 - 2.0)
            .collect::<Vec<_>>()
    };
    let (k, vv) = (v(), v());
    l.append(&k, &vv, tokens);
    l
}

/// The state bits of the hybrid seeds: a DeltaNet's state, a short convolution's.
const HYBRIDS: [u8; 2] = [8, 8 | 0x80];

/// A hybrid model's stream (layer 0 recurrent: a header whose start for it is the token
/// count, its state chunk, then layer 1's KV) and its stored prefix, behind `SHAPE`'s bytes with
/// the state `bits` set (`state_of`).
fn hybrid_seeds(bits: u8) -> Vec<Vec<u8>> {
    let mut head = shape_bytes(SHAPE).unwrap();
    head[0] |= bits;
    let (_, tokens, heads, dim) = shape_of(head);
    let shape = state_of(head).unwrap();
    let mut seed = 11;
    let mut st = Recurrent::zero(&shape);
    for v in st.conv.iter_mut().chain(st.matrix.iter_mut()) {
        *v = (lcg(&mut seed) % 2000) as f32 / 500.0 - 2.0;
    }
    let layers = [
        LayerKv::recurrent(heads, dim, tokens, Arc::new(st)),
        layer(&mut seed, SHAPE),
    ];
    let mut bytes = head.to_vec();
    let h = FetchMessage {
        body: Some(Body::Header(Header {
            layer_starts: vec![tokens as u32, 0],
            ..Default::default()
        })),
    };
    h.encode_length_delimited(&mut bytes).unwrap();
    for (l, lk) in layers.iter().enumerate() {
        let c = Chunk::encode(l as u32, lk, lk.start(), lk.end(), Codec::F16, None).unwrap();
        FetchMessage {
            body: Some(Body::Chunk(c.into())),
        }
        .encode_length_delimited(&mut bytes)
        .unwrap();
    }
    let prefix = PrefixKv {
        fingerprint: "fuzz".into(),
        token_ids: (0..tokens as u32).collect(),
        layers: layers.into_iter().map(Arc::new).collect(),
    };
    let mut stored = head.to_vec();
    edgeprompt_kv::write_prefix(&mut stored, &prefix, None).unwrap();
    vec![bytes, stored]
}

/// Valid inputs of every shape of `SHAPES`, each behind the four bytes naming its shape, and
/// the hybrid ones.
fn seeds() -> Vec<Vec<u8>> {
    let plain: Vec<Vec<u8>> = SHAPES
        .iter()
        .flat_map(|&shape| {
            let head = shape_bytes(shape).expect("a shape the fuzzer can make");
            assert_eq!(shape_of(head), shape);
            seeds_of(shape).into_iter().map(move |s| {
                let mut d = head.to_vec();
                d.extend(s);
                d
            })
        })
        .collect();
    plain
        .into_iter()
        .chain(HYBRIDS.into_iter().flat_map(hybrid_seeds))
        .collect()
}

/// Valid inputs: chunk streams in every codec, with and without zstd, and a stored prefix.
fn seeds_of(shape: (usize, usize, usize, usize)) -> Vec<Vec<u8>> {
    let (layers, tokens, _, _) = shape;
    let mut seed = 5;
    let kv: Vec<LayerKv> = (0..layers).map(|_| layer(&mut seed, shape)).collect();
    let mut out = Vec::new();
    for codec in Codec::ALL {
        for zstd in [None, Some(3)] {
            let mut bytes = Vec::new();
            for (l, lk) in kv.iter().enumerate() {
                for (s, e) in [(0, 2), (2, tokens)] {
                    let c = Chunk::encode(l as u32, lk, s, e, codec, zstd).unwrap();
                    let m = FetchMessage {
                        body: Some(Body::Chunk(c.into())),
                    };
                    m.encode_length_delimited(&mut bytes).unwrap();
                }
            }
            out.push(bytes);
        }
    }
    let prefix = PrefixKv {
        fingerprint: "fuzz".into(),
        token_ids: (0..tokens as u32).collect(),
        layers: kv.into_iter().map(Arc::new).collect(),
    };
    let mut stored = Vec::new();
    edgeprompt_kv::write_prefix(&mut stored, &prefix, None).unwrap();
    out.push(stored);
    out
}

#[test]
fn seeds_are_valid_so_mutations_reach_deep() {
    for shape in SHAPES {
        let (layers, tokens, heads, dim) = shape;
        let s = seeds_of(shape);
        // Two chunk streams per codec (with and without zstd), then the stored prefix.
        let streams = 2 * Codec::ALL.len();
        for stream in &s[..streams] {
            let mut re = Reassembler::new(layers, tokens, heads, dim);
            let mut rest = &stream[..];
            while !rest.is_empty() {
                let m = FetchMessage::decode_length_delimited(&mut rest).unwrap();
                let Some(Body::Chunk(c)) = m.body else {
                    panic!()
                };
                re.push(&Chunk::try_from(c).unwrap()).unwrap();
            }
            assert!(re.is_complete(), "{shape:?}");
        }
        let (back, _) =
            edgeprompt_kv::read_prefix(&mut &s[streams][..], &expect_of(shape, None)).unwrap();
        assert_eq!(back.token_ids.len(), tokens);
    }
    // Each hybrid stream reassembles into a state layer and a KV layer; its stored prefix reads
    // back the same state.
    for bits in HYBRIDS {
        let hy = hybrid_seeds(bits);
        let head: [u8; 4] = hy[0][..4].try_into().unwrap();
        let (layers, tokens, heads, dim) = shape_of(head);
        let mut re = Reassembler::new(layers, tokens, heads, dim)
            .with_state(state_of(head))
            .with_starts(&[tokens, 0])
            .unwrap();
        let mut rest = &hy[0][4..];
        let mut got = Vec::new();
        while !rest.is_empty() {
            let m = FetchMessage::decode_length_delimited(&mut rest).unwrap();
            if let Some(Body::Chunk(c)) = m.body {
                got.extend(re.push(&Chunk::try_from(c).unwrap()).unwrap());
            }
        }
        assert!(re.is_complete());
        assert!(got[0].1.state.is_some() && got[1].1.state.is_none());
        let short_conv = bits & 0x80 != 0;
        let st = got[0].1.state.as_ref().unwrap();
        assert_eq!(
            st.matrix.is_empty(),
            short_conv,
            "a short convolution's state is its window"
        );
        let (back, _) = edgeprompt_kv::read_prefix(
            &mut &hy[1][4..],
            &expect_of(shape_of(head), state_of(head)),
        )
        .unwrap();
        assert_eq!(back.layers[0].state, got[0].1.state);
        // Without a state shape the same stream is refused at its first chunk.
        let mut plain = Reassembler::new(layers, tokens, heads, dim);
        let mut rest = &hy[0][4..];
        let _header = FetchMessage::decode_length_delimited(&mut rest).unwrap();
        let m = FetchMessage::decode_length_delimited(&mut rest).unwrap();
        let Some(Body::Chunk(c)) = m.body else {
            panic!()
        };
        assert!(plain.push(&Chunk::try_from(c).unwrap()).is_err());
    }
    let s = seeds();
    // `EDGEPROMPT_FUZZ_SEEDS=fuzz/corpus/wire` saves them as the cargo-fuzz starting corpus.
    if let Some(dir) = std::env::var_os("EDGEPROMPT_FUZZ_SEEDS") {
        std::fs::create_dir_all(&dir).unwrap();
        for (i, seed) in s.iter().enumerate() {
            std::fs::write(std::path::Path::new(&dir).join(format!("seed-{i}")), seed).unwrap();
        }
    }
}

#[test]
fn mutated_untrusted_bytes_never_panic() {
    let seeds = seeds();
    let mut rng = 42u64;
    for _ in 0..20_000 {
        let mut d = seeds[(lcg(&mut rng) as usize) % seeds.len()].clone();
        for _ in 0..1 + lcg(&mut rng) % 4 {
            let n = d.len().max(1);
            match lcg(&mut rng) % 5 {
                0 if !d.is_empty() => {
                    let i = lcg(&mut rng) as usize % n;
                    d[i] ^= 1 << (lcg(&mut rng) % 8);
                }
                1 => d.truncate(lcg(&mut rng) as usize % n),
                2 => {
                    let i = lcg(&mut rng) as usize % n;
                    let junk: Vec<u8> = (0..lcg(&mut rng) % 16)
                        .map(|_| lcg(&mut rng) as u8)
                        .collect();
                    d.splice(i.min(d.len())..i.min(d.len()), junk);
                }
                3 if !d.is_empty() => {
                    let i = lcg(&mut rng) as usize % n;
                    d[i] = lcg(&mut rng) as u8;
                }
                _ => {
                    let (a, b) = (lcg(&mut rng) as usize % n, lcg(&mut rng) as usize % n);
                    let (a, b) = (a.min(b).min(d.len()), a.max(b).min(d.len()));
                    let part = d[a..b].to_vec();
                    d.extend_from_slice(&part);
                }
            }
        }
        read_untrusted(&d);
    }
    // Whatever cargo-fuzz saved locally (fuzz/corpus/wire), if present.
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/wire");
    for e in std::fs::read_dir(corpus).into_iter().flatten().flatten() {
        read_untrusted(&std::fs::read(e.path()).unwrap());
    }
}
