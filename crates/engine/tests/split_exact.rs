//! Split-prefix inference is exact (docs/design.md §2, §9): a cloud prompt prefilled once, its KV
//! exported and imported into a fresh sequence, then the private edge prompt and 32 greedy
//! tokens, against single-node inference on the concatenated ids.

mod common;

use std::sync::Arc;

use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Message, Model, Sequence};

const DECODE: usize = 32;

/// Logits of the prompt's last position and of each of `DECODE` greedy steps.
fn decode(model: &Model, seq: &mut Sequence, first: Vec<f32>) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut logits = vec![first];
    let mut ids = Vec::new();
    for _ in 0..DECODE {
        let id = argmax(logits.last().unwrap());
        ids.push(id);
        logits.push(seq.prefill(model, &[id]).unwrap());
    }
    (ids, logits)
}

struct Pair {
    cloud: Vec<u32>,
    edge: Vec<u32>,
}

fn pairs(model: &Model, n: usize) -> Vec<Pair> {
    let fx = common::read_json("split_pairs.json");
    let chat = model.chat.as_ref().expect("chat template");
    fx["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .take(n)
        .map(|p| {
            let s = chat
                .split(
                    p["cloud"].as_str().unwrap(),
                    &[Message::new("user", p["edge"].as_str().unwrap())],
                )
                .unwrap();
            Pair {
                cloud: model.tokenizer.encode(&s.cloud).unwrap(),
                edge: model.tokenizer.encode(&s.edge).unwrap(),
            }
        })
        .collect()
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn check(model: &Model, n_pairs: usize) {
    let pairs = pairs(model, n_pairs);
    assert!(pairs.len() >= 20, "need at least 20 pairs");
    let (mut agree, mut total, mut worst) = (0usize, 0usize, 0f32);
    for (i, p) in pairs.iter().enumerate() {
        // Split: the cloud prefills and exports; a fresh edge sequence imports and continues.
        let mut cloud = Sequence::new(model);
        cloud.prefill(model, &p.cloud).unwrap();
        let prefix = Arc::new(cloud.export_prefix(model).unwrap());
        let mut edge = Sequence::with_prefix(model, prefix).unwrap();
        let first = edge.prefill(model, &p.edge).unwrap();
        let (split_ids, split_logits) = decode(model, &mut edge, first);

        // Single node, same chunking: one sequence, cloud ids then edge ids.
        let mut single = Sequence::new(model);
        single.prefill(model, &p.cloud).unwrap();
        let first = single.prefill(model, &p.edge).unwrap();
        let (chunk_ids, chunk_logits) = decode(model, &mut single, first);
        assert_eq!(split_ids, chunk_ids, "pair {i}: tokens differ");
        for (s, (a, b)) in split_logits.iter().zip(&chunk_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "pair {i} step {s}: split logits are not bit-identical to chunked single-node"
            );
        }

        // Single node, one shot: the concatenated ids in one prefill call.
        let mut oneshot = Sequence::new(model);
        let all: Vec<u32> = p.cloud.iter().chain(&p.edge).copied().collect();
        let first = oneshot.prefill(model, &all).unwrap();
        let (one_ids, one_logits) = decode(model, &mut oneshot, first);
        worst = worst.max(max_abs_diff(&split_logits, &one_logits));
        agree += split_ids
            .iter()
            .zip(&one_ids)
            .filter(|(a, b)| a == b)
            .count();
        total += DECODE;
        eprintln!(
            "pair {i:2}: cloud {:4} + edge {:3} tokens: split == chunked (bitwise); vs one-shot max |dlogit| {:.3e}, tokens {}",
            p.cloud.len(),
            p.edge.len(),
            max_abs_diff(&split_logits, &one_logits),
            if split_ids == one_ids { "identical" } else { "differ" }
        );
    }
    eprintln!(
        "{}: one-shot vs split: max |dlogit| {worst:.3e}, greedy agreement {agree}/{total}",
        model.cfg.name
    );
    // The kernels are batch-invariant (per-row activation quantization, canonical block
    // order, per-key online softmax), so one-shot prefill is bit-identical as well.
    assert_eq!(worst, 0.0, "one-shot prefill is not bit-identical to split");
    assert_eq!(agree, total);
}

#[test]
fn split_prefix_is_exact_smollm2() {
    check(&common::smollm2(), 20);
}

#[test]
#[ignore = "slow: run in CI with --include-ignored"]
fn split_prefix_is_exact_qwen05() {
    check(&common::qwen05(), 20);
}

/// The layer-at-a-time pass (the edge's pipeline) gives the same bits as a whole prefill.
#[test]
fn layerwise_pass_matches_prefill() {
    use edgeprompt_engine::sequence::PrefillPass;
    let model = common::smollm2();
    let p = &pairs(&model, 20)[3];
    let mut cloud = Sequence::new(&model);
    cloud.prefill(&model, &p.cloud).unwrap();
    let prefix = Arc::new(cloud.export_prefix(&model).unwrap());
    let mut pass = PrefillPass::new(&model, &p.edge, p.cloud.len()).unwrap();
    for layer in &prefix.layers {
        pass.run_layer(&model, Some(layer)).unwrap();
    }
    let (mut seq, logits) = pass.finish(&model, prefix.clone()).unwrap();
    let mut whole = Sequence::with_prefix(&model, prefix).unwrap();
    let want = whole.prefill(&model, &p.edge).unwrap();
    assert_eq!(logits, want);
    let (a, _) = decode(&model, &mut seq, logits);
    let (b, _) = decode(&model, &mut whole, want);
    assert_eq!(a, b);
}

/// Gemma 3 pairs: a cloud prompt of 600..2000 tokens (ShareGPT answers joined after BOS; a
/// base model has no chat template) and a private continuation.
fn long_pairs(model: &Model, n: usize) -> Vec<Pair> {
    let fx = common::read_json("split_pairs.json");
    let texts: Vec<(&str, &str)> = fx["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["cloud"].as_str().unwrap(), p["edge"].as_str().unwrap()))
        .collect();
    let mut out = Vec::new();
    for k in 0..n {
        // Answers k, k+1, ... joined until the cloud prompt passes 600 tokens: each pair's
        // cloud prompt differs.
        let mut at = k;
        let mut cloud = String::new();
        let mut ids = Vec::new();
        while ids.len() < 600 {
            cloud.push_str(texts[at % texts.len()].0);
            cloud.push_str("\n\n");
            at += 1;
            ids = model.tokenizer.encode_prompt(&cloud).unwrap();
        }
        let edge = format!("Question: {}\nAnswer:", texts[at % texts.len()].1);
        let edge = model.tokenizer.encode(&edge).unwrap();
        assert!(
            (600..=2000).contains(&ids.len()),
            "cloud prompt of {}",
            ids.len()
        );
        out.push(Pair { cloud: ids, edge });
    }
    out
}

/// Sliding-window split: the cloud prompt's KV cut to the window on every sliding layer (what
/// the cloud sends and the edge keeps), the edge's private prefill run layer by layer as the
/// pipeline does, then 32 greedy tokens: bit-identical to one-shot single-node inference.
#[test]
#[ignore = "slow: run in CI with --include-ignored"]
fn split_prefix_is_exact_gemma3_with_window_cut() {
    use edgeprompt_engine::sequence::PrefillPass;
    let model = common::gemma3();
    let pairs = long_pairs(&model, 20);
    let (mut kept, mut full) = (0usize, 0usize);
    for (i, p) in pairs.iter().enumerate() {
        let mut cloud = Sequence::new(&model);
        cloud.prefill(&model, &p.cloud).unwrap();
        let whole = cloud.export_prefix(&model).unwrap();
        let cut = Arc::new(whole.window_cut(&model.cfg));
        kept += cut.bytes();
        full += whole.bytes();
        let mut pass = PrefillPass::new(&model, &p.edge, p.cloud.len()).unwrap();
        for layer in &cut.layers {
            pass.run_layer(&model, Some(layer)).unwrap();
        }
        let (mut seq, first) = pass.finish(&model, cut.clone()).unwrap();
        let (split_ids, split_logits) = decode(&model, &mut seq, first);

        let mut oneshot = Sequence::new(&model);
        let all: Vec<u32> = p.cloud.iter().chain(&p.edge).copied().collect();
        let first = oneshot.prefill(&model, &all).unwrap();
        let (one_ids, one_logits) = decode(&model, &mut oneshot, first);
        assert_eq!(split_ids, one_ids, "pair {i}: tokens differ");
        for (s, (a, b)) in split_logits.iter().zip(&one_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "pair {i} step {s}: window-cut split logits are not bit-identical to one-shot"
            );
        }
        eprintln!(
            "pair {i:2}: cloud {:4} + edge {:3} tokens: bit-identical over {DECODE} tokens; KV kept {:.1} of {:.1} MB",
            p.cloud.len(),
            p.edge.len(),
            cut.bytes() as f64 / 1e6,
            whole.bytes() as f64 / 1e6
        );
    }
    eprintln!(
        "gemma3: window cut keeps {:.1} % of the cloud KV",
        100.0 * kept as f64 / full as f64
    );
}

/// Gemma 3: sequences sharing one window-cut prefix, run as one batch (one decoding, one
/// prefilling), give bitwise what each gives alone.
#[test]
fn gemma3_batch_over_a_cut_prefix_is_bitwise_each_alone() {
    let model = common::gemma3();
    let p = &long_pairs(&model, 2);
    let mut cloud = Sequence::new(&model);
    cloud.prefill(&model, &p[0].cloud).unwrap();
    let prefix = Arc::new(cloud.export_prefix(&model).unwrap().window_cut(&model.cfg));
    let fresh = || Sequence::with_prefix(&model, prefix.clone()).unwrap();
    let (mut a, mut b) = (fresh(), fresh());
    a.prefill(&model, &p[0].edge).unwrap();
    let (a_next, b_ids) = ([7u32], &p[1].edge[..]);
    let (mut a1, mut b1) = (a.clone(), fresh());
    let batched = model
        .forward(&mut [(&mut a, &a_next[..]), (&mut b, b_ids)])
        .unwrap();
    let alone_a = a1.prefill(&model, &a_next).unwrap();
    let alone_b = b1.prefill(&model, b_ids).unwrap();
    assert_eq!(batched[0], alone_a, "decoding row differs in a batch");
    assert_eq!(batched[1], alone_b, "prefilling rows differ in a batch");
}

/// A batch of 1130 rows runs a layer in pieces of at most 512 (`Model::forward_layer`): one
/// sequence's rows cross two cuts and another, over a prefix, is cut from its batch mate.
/// Each gives bitwise what it gives alone in 64-token chunks, its KV included.
#[test]
fn long_batch_run_in_pieces_is_bitwise_each_alone() {
    use edgeprompt_engine::sequence::PrefillPass;
    let model = common::smollm2();
    let ids = |n: usize, seed: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| 100 + (i * 7919 + seed) % 20000)
            .collect()
    };
    let mut cloud = Sequence::new(&model);
    cloud.prefill_chunked(&model, &ids(50, 1), 16).unwrap();
    let prefix = Arc::new(cloud.export_prefix(&model).unwrap());
    let parts = [ids(100, 2), ids(1000, 3), ids(30, 4)];
    let fresh = |i: usize| match i {
        2 => Sequence::with_prefix(&model, prefix.clone()).unwrap(),
        _ => Sequence::new(&model),
    };
    let (mut a, mut b, mut c) = (fresh(0), fresh(1), fresh(2));
    let batched = model
        .forward(&mut [
            (&mut a, &parts[0]),
            (&mut b, &parts[1]),
            (&mut c, &parts[2]),
        ])
        .unwrap();
    for (i, (seq, got)) in [a, b, c].into_iter().zip(&batched).enumerate() {
        let mut alone = fresh(i);
        let want = alone.prefill_chunked(&model, &parts[i], 64).unwrap();
        assert_eq!(*got, want, "sequence {i}'s logits differ in the batch");
        for l in 0..model.cfg.n_layer {
            assert!(
                seq.layer_kv(l) == alone.layer_kv(l),
                "sequence {i}'s KV of layer {l}"
            );
        }
    }
    // The layer-at-a-time pass (the cloud's) cuts its rows the same way.
    let mut pass = PrefillPass::new(&model, &parts[1], 0).unwrap();
    for _ in 0..model.cfg.n_layer {
        pass.run_layer(&model, None).unwrap();
    }
    let kv = pass.into_prefix(&model).unwrap();
    let mut alone = Sequence::new(&model);
    alone.prefill_chunked(&model, &parts[1], 64).unwrap();
    for l in 0..model.cfg.n_layer {
        assert!(
            *kv.layers[l] == *alone.layer_kv(l),
            "the pass's KV of layer {l}"
        );
    }
}

/// A conversation's next turn continued from everything the last turn computed (the edge's
/// private prefix cache: cloud prefix, private prompt and answer exported as one prefix, cut
/// anywhere) gives the bits of the same turn run on the cloud prefix alone.
#[test]
fn a_turn_continued_from_the_last_turns_kv_is_bitwise_the_same() {
    let model = common::smollm2();
    for (i, p) in pairs(&model, 6).iter().enumerate() {
        let cloud = {
            let mut s = Sequence::new(&model);
            s.prefill(&model, &p.cloud).unwrap();
            Arc::new(s.export_prefix(&model).unwrap())
        };
        // Turn 1: the private prompt and an answer.
        let mut turn1 = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let first = turn1.prefill(&model, &p.edge).unwrap();
        let (answer, _) = decode(&model, &mut turn1, first);
        let kept = turn1.export_whole(&model).unwrap();
        assert_eq!(kept.n_tokens(), turn1.len());
        // Turn 2 shares all of turn 1's computed tokens but the last few, then goes on.
        let held: Vec<u32> = kept.token_ids.clone();
        let cut = held.len() - 3.min(held.len() - p.cloud.len());
        let rest: Vec<u32> = held[p.cloud.len()..]
            .iter()
            .chain(&p.edge)
            .copied()
            .collect();
        let mut cold = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let want = cold.prefill(&model, &rest).unwrap();
        let (want_ids, want_logits) = decode(&model, &mut cold, want);

        let mut warm = Sequence::with_prefix(&model, Arc::new(kept.first(cut))).unwrap();
        let got = warm.prefill(&model, &rest[cut - p.cloud.len()..]).unwrap();
        let (got_ids, got_logits) = decode(&model, &mut warm, got);
        assert_eq!(got_ids, want_ids, "pair {i}: tokens differ");
        for (s, (a, b)) in got_logits.iter().zip(&want_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "pair {i} step {s}: logits from the kept KV are not bit-identical"
            );
        }
        assert!(!answer.is_empty());
    }
}

/// The same with turn 1's positions kept after the cloud prefix rather than copied with it
/// (`export_continued`: the prefix held, not copied): turn 2 on them, alone and in one batch
/// with a sequence on the cloud prefix and one with none, gives every step's logits bit for bit
/// as the same turn run from the cloud prefix alone; kept again, they hold both turns.
#[test]
fn a_turn_on_kept_positions_after_a_held_prefix_is_bitwise_the_same() {
    let model = common::smollm2();
    for (i, p) in pairs(&model, 3).iter().enumerate() {
        let cloud = {
            let mut s = Sequence::new(&model);
            s.prefill(&model, &p.cloud).unwrap();
            Arc::new(s.export_prefix(&model).unwrap())
        };
        let mut turn1 = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let first = turn1.prefill(&model, &p.edge).unwrap();
        decode(&model, &mut turn1, first);
        let kept = Arc::new(turn1.export_continued(&model).unwrap());
        assert!(
            Arc::ptr_eq(kept.prefix.as_ref().unwrap(), &cloud),
            "the prefix is held"
        );
        assert_eq!(kept.n_tokens(), turn1.len());
        assert_eq!(
            kept.bytes(),
            turn1.private_kv_bytes(),
            "only turn 1's own positions"
        );
        let rest: Vec<u32> = turn1
            .private_tokens()
            .iter()
            .chain(&p.edge)
            .copied()
            .collect();
        let mut cold = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let want = cold.prefill(&model, &rest).unwrap();
        let (want_ids, want_logits) = decode(&model, &mut cold, want);

        let mut warm = Sequence::continuing(&model, kept.clone()).unwrap();
        assert_eq!(warm.prefix_len(), kept.n_tokens());
        let got = warm.prefill(&model, &p.edge).unwrap();
        let (got_ids, got_logits) = decode(&model, &mut warm, got);
        assert_eq!(got_ids, want_ids, "pair {i}: tokens differ");
        for (s, (a, b)) in got_logits.iter().zip(&want_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "pair {i} step {s}: logits on the kept positions are not bit-identical"
            );
        }
        // In a batch: the kept turn's prompt beside a sequence on the cloud prefix (their
        // queries share its tiles) and one with no prefix.
        let mut batched_warm = Sequence::continuing(&model, kept.clone()).unwrap();
        let mut other = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let mut lone = Sequence::new(&model);
        let out = model
            .forward(&mut [
                (&mut other, &p.edge[..]),
                (&mut batched_warm, &p.edge[..]),
                (&mut lone, &p.cloud[..]),
            ])
            .unwrap();
        assert_eq!(
            out[1], want_logits[0],
            "pair {i}: the kept turn differs in a batch"
        );
        let mut alone = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        assert_eq!(out[0], alone.prefill(&model, &p.edge).unwrap());
        // Kept again: both turns' positions after the same prefix.
        let again = warm.export_continued(&model).unwrap();
        assert!(Arc::ptr_eq(again.prefix.as_ref().unwrap(), &cloud));
        assert_eq!(again.n_tokens(), warm.len());
        let mut ids = kept.token_ids.clone();
        ids.extend_from_slice(warm.private_tokens());
        assert_eq!(again.token_ids, ids);
    }
}

/// A turn that parts from the kept positions mid-way (an earlier answer that re-tokenizes
/// differently): run on the kept positions before the difference (borrowed, not copied), then
/// its own tokens, it gives every step's logits bit for bit as the same turn from the cloud
/// prefix alone, alone and in a batch beside a sequence on the whole kept entry; kept again,
/// it holds only the shared positions and its own.
#[test]
fn a_turn_on_the_first_kept_positions_is_bitwise_the_same() {
    let model = common::smollm2();
    for (i, p) in pairs(&model, 3).iter().enumerate() {
        let cloud = {
            let mut s = Sequence::new(&model);
            s.prefill(&model, &p.cloud).unwrap();
            Arc::new(s.export_prefix(&model).unwrap())
        };
        let mut turn1 = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let first = turn1.prefill(&model, &p.edge).unwrap();
        decode(&model, &mut turn1, first);
        let kept = Arc::new(turn1.export_continued(&model).unwrap());
        // Turn 2 shares turn 1's prompt and the first half of its answer, then goes its way.
        let share = p.edge.len() + (kept.token_ids.len() - p.edge.len()) / 2;
        assert!(share < kept.token_ids.len());
        let own: Vec<u32> = p.edge.iter().rev().take(6).copied().collect();
        let rest: Vec<u32> = kept.token_ids[..share]
            .iter()
            .chain(&own)
            .copied()
            .collect();
        let mut cold = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        let want = cold.prefill(&model, &rest).unwrap();
        let (want_ids, want_logits) = decode(&model, &mut cold, want);

        let mut warm = Sequence::continuing_first(&model, kept.clone(), share).unwrap();
        assert_eq!(warm.prefix_len(), p.cloud.len() + share);
        let got = warm.prefill(&model, &own).unwrap();
        let (got_ids, got_logits) = decode(&model, &mut warm, got);
        assert_eq!(got_ids, want_ids, "pair {i}: tokens differ");
        for (s, (a, b)) in got_logits.iter().zip(&want_logits).enumerate() {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "pair {i} step {s}: logits on the first kept positions are not bit-identical"
            );
        }
        // In a batch beside a sequence on the whole entry (both read its buffers).
        let mut part = Sequence::continuing_first(&model, kept.clone(), share).unwrap();
        let mut whole = Sequence::continuing(&model, kept.clone()).unwrap();
        let out = model
            .forward(&mut [(&mut whole, &own[..]), (&mut part, &own[..])])
            .unwrap();
        assert_eq!(out[1], want_logits[0], "pair {i}: differs in a batch");
        let mut alone = Sequence::continuing(&model, kept.clone()).unwrap();
        assert_eq!(out[0], alone.prefill(&model, &own).unwrap());
        // Kept again: the shared positions and turn 2's, after the same prefix.
        let again = warm.export_continued(&model).unwrap();
        assert!(Arc::ptr_eq(again.prefix.as_ref().unwrap(), &cloud));
        let mut ids = kept.token_ids[..share].to_vec();
        ids.extend_from_slice(warm.private_tokens());
        assert_eq!(again.token_ids, ids);
        assert_eq!(again.n_tokens(), warm.len());
        let mut fresh = Sequence::continuing(&model, Arc::new(again)).unwrap();
        let mut from_cloud = Sequence::with_prefix(&model, cloud.clone()).unwrap();
        from_cloud.prefill(&model, &ids).unwrap();
        assert_eq!(
            fresh.prefill(&model, &own[..1]).unwrap(),
            from_cloud.prefill(&model, &own[..1]).unwrap(),
            "pair {i}: the entry kept again differs"
        );
        assert!(
            Sequence::continuing_first(&model, kept.clone(), kept.token_ids.len() + 1).is_err()
        );
    }
}
