//! Hybrid models (Qwen3.5: Gated DeltaNet layers between gated attention layers; LFM2: short
//! convolutions between attention layers) split between cloud and edge: the cloud prompt's recurrent layers travel as their state at its end, its
//! attention layers as KV, and the edge continues both. Every way of running the same tokens
//! (one sequence, a prefix and a continuation, the edge's layer-by-layer pass, chunks of any
//! size, a batch with another sequence, a conversation kept between turns) gives the same bits,
//! around the convolution's width (cloud prompts of 1 to 5 tokens) and past it.

mod common;

use common::{assert_same, long_ids, same, synth};

use std::sync::Arc;

use edgeprompt_engine::recurrent::{Recurrence, Recurrent, ShortConv};
use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{LayerKv, Model, PrefixKv, Sequence};

const DECODE: usize = 6;

fn model() -> Model {
    synth("qwen35")
}

fn answer(m: &Model, seq: &mut Sequence, first: Vec<f32>) -> Vec<Vec<f32>> {
    common::answer(m, seq, first, DECODE)
}

#[test]
fn the_shape_is_read_from_the_file() {
    let m = model();
    let c = &m.cfg;
    assert_eq!(c.n_layer, 8, "the MTP block after the trunk is not a layer");
    let recurrent: Vec<usize> = (0..8).filter(|&l| c.is_recurrent(l)).collect();
    assert_eq!(recurrent, [0, 1, 2, 4, 5, 6]);
    let Some(Recurrence::DeltaNet(s)) = c.features.recurrence else {
        panic!("{:?}", c.features.recurrence)
    };
    assert_eq!(
        (s.conv_kernel, s.k_heads, s.v_heads, s.head_dim),
        (4, 2, 4, 32)
    );
    // Per token only the two attention layers' KV; the six states are fixed.
    assert_eq!(c.kv_bytes_per_token(), 2 * 2 * 2 * 2 * 64);
    assert_eq!(c.state_bytes(), 6 * 4 * (3 * 256 + 4 * 32 * 32));
}

#[test]
fn lfm2_layers_are_read_from_the_per_layer_kv_heads() {
    let m = synth("lfm2");
    let c = &m.cfg;
    let attention: Vec<usize> = (0..c.n_layer).filter(|&l| !c.is_recurrent(l)).collect();
    assert_eq!((c.n_layer, c.n_kv_head), (6, 2));
    assert_eq!(attention, [2, 5], "the layers whose KV head count is not 0");
    assert_eq!(
        c.features.recurrence,
        Some(Recurrence::ShortConv(ShortConv {
            kernel: 3,
            width: 256
        }))
    );
    // Four windows of two rows of 256 floats: 8 KB whatever the prompt's length.
    assert_eq!(c.state_bytes(), 4 * 2 * 256 * 4);
    assert_eq!(c.kv_bytes_per_token(), 2 * 2 * 2 * 2 * 64);
}

/// Qwen3.5, Qwen3.5-MoE (whose batched rows also share experts) and LFM2 (short convolutions).
#[test]
fn split_equals_single_node_bit_for_bit_around_the_convolution_width() {
    for name in ["qwen35", "qwen35moe", "lfm2"] {
        split_equals_single_node(name, &synth(name));
    }
}

fn split_equals_single_node(name: &str, m: &Model) {
    let all = long_ids(m);
    let edge = m
        .tokenizer
        .encode(" My booking is for Friday; can I still get my money back?")
        .unwrap();
    for n in [1, 2, 3, 4, 5, 63, 64, 65, 1000] {
        let cloud = &all[..n];
        let whole: Vec<u32> = cloud.iter().chain(&edge).copied().collect();
        let mut single = Sequence::new(m);
        let first = single.prefill(m, &whole).unwrap();
        let want = answer(m, &mut single, first);

        // The cloud's pass, layer by layer, exported as a prefix: its recurrent layers hold a
        // state and no rows.
        let mut pass = PrefillPass::new(m, cloud, 0).unwrap();
        for _ in 0..m.cfg.n_layer {
            pass.run_layer(m, None).unwrap();
        }
        let prefix = Arc::new(pass.into_prefix(m).unwrap());
        for (l, kv) in prefix.layers.iter().enumerate() {
            assert_eq!(kv.state.is_some(), m.cfg.is_recurrent(l), "layer {l}");
            assert_eq!(kv.end(), n);
            if m.cfg.is_recurrent(l) {
                assert!(kv.is_empty());
            }
        }
        // The same prefix from a sequence's export.
        let mut cloud_seq = Sequence::new(m);
        cloud_seq.prefill(m, cloud).unwrap();
        let exported = cloud_seq.export_prefix(m).unwrap();
        for (a, b) in prefix.layers.iter().zip(&exported.layers) {
            assert_eq!(
                a, b,
                "{name}, n = {n}: the pass and the sequence export differ"
            );
        }

        // The edge's pipeline: its layer l runs with cloud layer l.
        let mut edge_pass = PrefillPass::new(m, &edge, n).unwrap();
        for l in 0..m.cfg.n_layer {
            edge_pass.run_layer(m, Some(&prefix.layers[l])).unwrap();
        }
        let (mut seq, first) = edge_pass.finish(m, prefix.clone()).unwrap();
        assert_same(
            &format!("{name}, n = {n}: edge pipeline"),
            &answer(m, &mut seq, first),
            &want,
        );

        // A sequence on the prefix, its prompt in chunks of 5 (each chunk continues the state).
        let mut on_prefix = Sequence::with_prefix(m, prefix.clone()).unwrap();
        let first = on_prefix.prefill_chunked(m, &edge, 5).unwrap();
        assert_same(
            &format!("{name}, n = {n}: chunked on the prefix"),
            &answer(m, &mut on_prefix, first),
            &want,
        );

        // In a batch beside another sequence (on the same prefix, another prompt).
        let mut a = Sequence::with_prefix(m, prefix.clone()).unwrap();
        let mut b = Sequence::with_prefix(m, prefix.clone()).unwrap();
        let other = m.tokenizer.encode(" And on Sunday?").unwrap();
        let mut batch = [(&mut b, other.as_slice()), (&mut a, edge.as_slice())];
        let mut out = m.forward(&mut batch).unwrap();
        let first = out.pop().unwrap();
        assert_same(
            &format!("{name}, n = {n}: batched"),
            &answer(m, &mut a, first),
            &want,
        );
    }
}

#[test]
fn chunking_and_one_shot_agree_at_every_chunk_size() {
    let m = model();
    let ids = &long_ids(&m)[..200];
    let want = Sequence::new(&m).prefill(&m, ids).unwrap();
    for chunk in [1, 2, 3, 4, 5, 7, 64, 199] {
        let got = Sequence::new(&m).prefill_chunked(&m, ids, chunk).unwrap();
        assert!(same(&got, &want), "chunks of {chunk}");
    }
}

#[test]
fn a_kept_conversation_continues_only_from_its_end() {
    let m = model();
    let all = long_ids(&m);
    let (cloud, turn1, turn2) = (&all[..40], &all[40..70], &all[70..90]);
    let mut seq = Sequence::new(&m);
    seq.prefill(&m, cloud).unwrap();
    let prefix = Arc::new(seq.export_prefix(&m).unwrap());
    let mut first = Sequence::with_prefix(&m, prefix.clone()).unwrap();
    first.prefill(&m, turn1).unwrap();
    let kept = Arc::new(first.export_continued(&m).unwrap());
    // The next turn from the kept end equals one sequence over everything.
    let mut next = Sequence::continuing(&m, kept.clone()).unwrap();
    let got = next.prefill(&m, turn2).unwrap();
    let mut single = Sequence::new(&m);
    let want = single.prefill(&m, &all[..90]).unwrap();
    assert!(same(&got, &want));
    // And a whole export after it, as a prefix, continues the same.
    let whole = Arc::new(next.export_continued(&m).unwrap());
    let mut after = Sequence::continuing(&m, whole).unwrap();
    let mut again = Sequence::new(&m);
    again.prefill(&m, &all[..90]).unwrap();
    assert!(same(
        &after.prefill(&m, &all[90..95]).unwrap(),
        &again.prefill(&m, &all[90..95]).unwrap()
    ));
    // A turn that parts inside the kept positions cannot reuse them: the state there is gone.
    let e = Sequence::continuing_first(&m, kept, 10).err().unwrap();
    assert!(e.to_string().contains("recurrent"), "{e}");
}

#[test]
fn a_state_that_does_not_fit_is_refused() {
    let m = model();
    let mut seq = Sequence::new(&m);
    seq.prefill(&m, &long_ids(&m)[..20]).unwrap();
    let good = seq.export_prefix(&m).unwrap();
    good.check_fits(&m.cfg, &m.fingerprint).unwrap();
    let with = |l: usize, f: &dyn Fn(&LayerKv) -> LayerKv| {
        let mut p: PrefixKv = good.clone();
        p.layers[l] = Arc::new(f(&p.layers[l]));
        p.check_fits(&m.cfg, &m.fingerprint)
    };
    let state = good.layers[0].state.clone().unwrap();
    let bent = |f: &dyn Fn(&mut Recurrent)| {
        let mut s = (*state).clone();
        f(&mut s);
        Arc::new(s)
    };
    let (h, d) = (m.cfg.n_kv_head, m.cfg.head_dim);
    let cases: Vec<(&str, usize, LayerKv)> = vec![
        ("no state", 0, LayerKv::new(h, d).starting_at(20)),
        (
            "a NaN",
            0,
            LayerKv::recurrent(h, d, 20, bent(&|s| s.matrix[5] = f32::NAN)),
        ),
        (
            "a short matrix",
            0,
            LayerKv::recurrent(h, d, 20, bent(&|s| s.matrix.truncate(100))),
        ),
        (
            "a long window",
            0,
            LayerKv::recurrent(h, d, 20, bent(&|s| s.conv.push(0.0))),
        ),
    ];
    for (what, l, layer) in cases {
        assert!(with(l, &|_| layer.clone()).is_err(), "{what} was taken");
    }
    let attention = |kv: &LayerKv| {
        let mut kv = kv.clone();
        kv.state = Some(state.clone());
        kv
    };
    assert!(
        with(3, &attention).is_err(),
        "a state on an attention layer was taken"
    );
}
