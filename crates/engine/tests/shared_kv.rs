//! Gemma 4 split between cloud and edge: layers that read an earlier layer's KV own none, so
//! the cloud's prefix holds no rows for them (nothing to send or sign) and the edge's read the
//! KV of the layer they name; sliding layers of their own head size are cut to the window.
//! Every way of running the same tokens (one sequence; a window-cut prefix and a
//! continuation; the edge's layer-by-layer pass; chunks; a batch; a prompt longer than a
//! layer's 512-row piece, whose shared layers then see only the rows before each piece) gives
//! the same bits, with cloud prompts inside the window, at its edge and beyond it.

mod common;

use common::{assert_same, long_ids, same, synth};

use std::sync::Arc;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Model, Sequence};

const DECODE: usize = 6;

fn model() -> Model {
    synth("gemma4")
}

fn answer(m: &Model, seq: &mut Sequence, first: Vec<f32>) -> Vec<Vec<f32>> {
    common::answer(m, seq, first, DECODE)
}

#[test]
fn the_layout_is_read_from_the_file() {
    let m = model();
    let c = &m.cfg;
    let sliding: Vec<usize> = (0..c.n_layer)
        .filter(|&l| c.window_of(l).is_some())
        .collect();
    assert_eq!(sliding, [0, 1, 3, 4, 6, 7]);
    assert_eq!(c.window, Some(16));
    // The last three read the last sliding (4) and the last global (5) layer that own KV.
    assert_eq!(c.kv_source, [0, 1, 2, 3, 4, 5, 4, 4, 5]);
    let owners: Vec<usize> = (0..c.n_layer).filter(|&l| c.owns_kv(l)).collect();
    assert_eq!(owners, [0, 1, 2, 3, 4, 5]);
    assert_eq!((c.head_dim_of(0), c.head_dim_of(2)), (64, 128));
    assert_eq!(
        c.ffn_widths,
        [512, 512, 512, 512, 512, 512, 1024, 1024, 1024]
    );
    assert_eq!(c.features.per_layer_embd, 32);
    // f16 K and V of 2 heads: four sliding layers of 64, two global of 128; none for the rest.
    assert_eq!(c.kv_bytes_per_token(), 2 * 2 * 2 * (4 * 64 + 2 * 128));
}

#[test]
fn split_equals_single_node_bit_for_bit_inside_and_beyond_the_window() {
    let m = model();
    let c = &m.cfg;
    let all = long_ids(&m);
    let edge = m
        .tokenizer
        .encode(" My booking is for Friday; can I still get my money back?")
        .unwrap();
    for n in [1, 2, 15, 16, 17, 40, 1000] {
        let cloud = &all[..n];
        let whole: Vec<u32> = cloud.iter().chain(&edge).copied().collect();
        let mut single = Sequence::new(&m);
        let first = single.prefill(&m, &whole).unwrap();
        let want = answer(&m, &mut single, first);

        // The cloud's pass, layer by layer, as the prefix it ships: shared layers empty,
        // sliding layers cut to the window.
        let mut pass = PrefillPass::new(&m, cloud, 0).unwrap();
        for _ in 0..c.n_layer {
            pass.run_layer(&m, None).unwrap();
        }
        let full = pass.into_prefix(&m).unwrap();
        let prefix = Arc::new(full.window_cut(c));
        for (l, kv) in prefix.layers.iter().enumerate() {
            assert_eq!(kv.end(), n, "layer {l}");
            assert_eq!(kv.head_dim, c.head_dim_of(l), "layer {l}");
            let rows = match (c.owns_kv(l), c.window_of(l)) {
                (false, _) => 0,
                (true, Some(w)) => n.min(w - 1),
                (true, None) => n,
            };
            assert_eq!(kv.len(), rows, "n = {n}, layer {l}");
        }
        // The same prefix from a sequence's export.
        let mut cloud_seq = Sequence::new(&m);
        cloud_seq.prefill(&m, cloud).unwrap();
        let exported = cloud_seq.export_prefix(&m).unwrap();
        for (l, (a, b)) in full.layers.iter().zip(&exported.layers).enumerate() {
            assert_eq!(a, b, "n = {n}, layer {l}: the pass and the export differ");
        }

        // The edge's pipeline: its layer l runs with cloud layer l.
        let mut edge_pass = PrefillPass::new(&m, &edge, n).unwrap();
        for l in 0..c.n_layer {
            edge_pass.run_layer(&m, Some(&prefix.layers[l])).unwrap();
        }
        let (mut seq, first) = edge_pass.finish(&m, prefix.clone()).unwrap();
        assert_same(
            &format!("n = {n}: edge pipeline"),
            &answer(&m, &mut seq, first),
            &want,
        );

        // A sequence on the prefix, its prompt in chunks of 5.
        let mut on_prefix = Sequence::with_prefix(&m, prefix.clone()).unwrap();
        let first = on_prefix.prefill_chunked(&m, &edge, 5).unwrap();
        assert_same(
            &format!("n = {n}: chunked on the prefix"),
            &answer(&m, &mut on_prefix, first),
            &want,
        );

        // In a batch beside another sequence on the same prefix.
        let mut a = Sequence::with_prefix(&m, prefix.clone()).unwrap();
        let mut b = Sequence::with_prefix(&m, prefix.clone()).unwrap();
        let other = m.tokenizer.encode(" And on Sunday?").unwrap();
        let mut batch = [(&mut b, other.as_slice()), (&mut a, edge.as_slice())];
        let mut out = m.forward(&mut batch).unwrap();
        let first = out.pop().unwrap();
        assert_same(
            &format!("n = {n}: batched"),
            &answer(&m, &mut a, first),
            &want,
        );
    }
}

/// A prompt of more rows than a layer runs at once (512): its shared layers run piece by
/// piece against a KV that already holds every row of the pass, each piece seeing only the
/// rows up to its own.
#[test]
fn a_long_prompt_in_pieces_equals_it_in_chunks() {
    let m = model();
    let ids = long_ids(&m);
    let want = Sequence::new(&m).prefill(&m, &ids).unwrap();
    for chunk in [1, 7, 511, 513] {
        let got = Sequence::new(&m).prefill_chunked(&m, &ids, chunk).unwrap();
        assert!(same(&got, &want), "chunks of {chunk}");
    }
    // Two sequences of 700 and 400 rows in one batch: pieces that cut both.
    let (x, y) = (&ids[..700], &ids[300..700]);
    let alone = [
        Sequence::new(&m).prefill(&m, x).unwrap(),
        Sequence::new(&m).prefill(&m, y).unwrap(),
    ];
    let (mut a, mut b) = (Sequence::new(&m), Sequence::new(&m));
    let out = m.forward(&mut [(&mut a, x), (&mut b, y)]).unwrap();
    for (i, (g, w)) in out.iter().zip(&alone).enumerate() {
        assert!(same(g, w), "sequence {i} batched");
    }
}

/// A conversation kept between turns: the layers that read another's KV keep none of their
/// own, and a turn continued from the kept positions (at their end or inside them, where the
/// next turn parts from them) equals one sequence over everything; the window cut applies.
#[test]
fn a_kept_conversation_continues_at_its_end_and_inside_it() {
    let m = model();
    let all = long_ids(&m);
    let (cloud, turn1, turn2) = (&all[..40], &all[40..70], &all[70..90]);
    let mut seq = Sequence::new(&m);
    seq.prefill(&m, cloud).unwrap();
    let prefix = Arc::new(seq.export_prefix(&m).unwrap().window_cut(&m.cfg));
    let mut first = Sequence::with_prefix(&m, prefix.clone()).unwrap();
    first.prefill(&m, turn1).unwrap();
    let kept = Arc::new(first.export_continued(&m).unwrap());
    for (l, layer) in kept.layers.iter().enumerate() {
        let reads = (!m.cfg.owns_kv(l)).then(|| m.cfg.kv_source_of(l));
        assert_eq!(layer.kv_of, reads, "kept layer {l}");
        assert_eq!(layer.len(), if reads.is_some() { 0 } else { 30 });
    }
    let mut next = Sequence::continuing(&m, kept.clone()).unwrap();
    let got = next.prefill(&m, turn2).unwrap();
    let want = Sequence::new(&m).prefill(&m, &all[..90]).unwrap();
    assert!(same(&got, &want), "continued at the end");
    // Parting 10 positions into the kept ones.
    let mut part = Sequence::continuing_first(&m, kept, 10).unwrap();
    let got = part.prefill(&m, &all[50..60]).unwrap();
    let mut ids = all[..50].to_vec();
    ids.extend_from_slice(&all[50..60]);
    let want = Sequence::new(&m).prefill(&m, &ids).unwrap();
    assert!(same(&got, &want), "continued inside");
}

/// A prefix whose shared layer claims rows or another source, or whose owning layer claims to
/// read another's, does not fit the model.
#[test]
fn a_prefix_that_misnames_its_shared_layers_is_refused() {
    use edgeprompt_engine::{LayerKv, PrefixKv};
    let m = model();
    let c = &m.cfg;
    let mut seq = Sequence::new(&m);
    seq.prefill(&m, &long_ids(&m)[..20]).unwrap();
    let good = seq.export_prefix(&m).unwrap();
    good.check_fits(c, &m.fingerprint).unwrap();
    let last = c.n_layer - 1;
    let with = |l: usize, kv: LayerKv| {
        let mut p: PrefixKv = good.clone();
        p.layers[l] = Arc::new(kv);
        p.check_fits(c, &m.fingerprint)
    };
    let d = c.head_dim_of(last);
    let src = c.kv_source_of(last);
    let own = (*good.layers[src]).clone();
    let cases = [
        ("a shared layer with rows", last, own),
        ("another source", last, LayerKv::reading(2, d, 20, 3)),
        ("no source", last, LayerKv::new(2, d).starting_at(20)),
        ("an owner said to read", src, LayerKv::reading(2, d, 20, 1)),
    ];
    for (what, l, kv) in cases {
        assert!(with(l, kv).is_err(), "{what}");
    }
}
