//! Continuous batching with the real SmolLM2 model: requests that join a running batch get
//! exactly the tokens they get alone, and a cloud prompt's KV is held once however many
//! requests use it.

use std::sync::Arc;

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{Batcher, Done, SchedulerConfig};
use edgeprompt_engine::{Model, PrefixKv, Sequence};

use crate::common;
use common::{done, edge_ids, job, model, CODING, SUPPORT};

const QUESTIONS: [&str; 8] = [
    "How do I get a refund?",
    "Is my train on time?",
    "Can I bring a bike?",
    "What is the fee for late cancellation?",
    "fn main() { let v = vec![1]; println!(\"{}\", v[3]); }",
    "I missed my train, what now?",
    "Do children travel free?",
    "Write a short apology.",
];

fn prefix(model: &Model, system: &str) -> Arc<PrefixKv> {
    let (cloud, _) = edge_ids(model, system, "");
    let mut seq = Sequence::new(model);
    seq.prefill(model, &cloud).unwrap();
    Arc::new(seq.export_prefix(model).unwrap())
}

fn batcher(model: &Arc<Model>, prefill_chunk: usize) -> Batcher {
    let cfg = SchedulerConfig {
        prefill_chunk,
        ..SchedulerConfig::default()
    };
    Batcher::new(model.clone(), cfg, Arc::new(Metrics::new()))
}

#[test]
fn sixteen_requests_joining_a_running_batch_get_their_tokens_alone() {
    let m = model();
    let prefixes = [prefix(&m, SUPPORT), prefix(&m, CODING)];
    let requests: Vec<(usize, Vec<u32>)> = (0..16)
        .map(|i| {
            let system = [SUPPORT, CODING][i % 2];
            (i % 2, edge_ids(&m, system, QUESTIONS[i / 2]).1)
        })
        .collect();
    let alone: Vec<Done> = requests
        .iter()
        .map(|(p, ids)| {
            let mut b = batcher(&m, 512);
            let (j, mut rx) = job(Some(prefixes[*p].clone()), ids.clone(), 24);
            b.admit(j).unwrap();
            while !b.is_idle() {
                b.step();
            }
            done(&mut rx)
        })
        .collect();
    // Together: a small prefill chunk so prompts are cut across steps and prefill mixes with
    // decoding; requests join while others are mid-answer.
    let mut b = batcher(&m, 48);
    let mut rxs = Vec::new();
    let mut steps = 0;
    for (i, (p, ids)) in requests.iter().enumerate() {
        let (j, rx) = job(Some(prefixes[*p].clone()), ids.clone(), 24);
        b.admit(j).unwrap();
        rxs.push(rx);
        if i % 3 == 2 {
            b.step();
            steps += 1;
        }
    }
    let mut widest = 0;
    while !b.is_idle() {
        widest = widest.max(b.usage().sequences);
        b.step();
        steps += 1;
    }
    assert!(widest >= 8, "batch never held many sequences ({widest})");
    for (i, (rx, want)) in rxs.iter_mut().zip(&alone).enumerate() {
        let got = done(rx);
        assert_eq!(got.token_ids, want.token_ids, "request {i}");
        assert_eq!(got, *want, "request {i}");
    }
    let alone_tokens: usize = alone.iter().map(|d| d.completion_tokens).sum();
    eprintln!("16 requests, {alone_tokens} tokens: {steps} batched steps (alone they take {} steps or more)", alone_tokens);
}

/// Run `n` identical requests on `prefixes[i]` until every prompt is prefilled; the KV usage.
fn usage_with(
    m: &Arc<Model>,
    prefixes: &[Arc<PrefixKv>],
    prompt: &[u32],
) -> edgeprompt_edge::scheduler::KvUsage {
    let mut b = batcher(m, 4096);
    let mut rxs = Vec::new();
    for p in prefixes {
        let (j, rx) = job(Some(p.clone()), prompt.to_vec(), 8);
        b.admit(j).unwrap();
        rxs.push(rx);
    }
    b.step();
    b.usage()
}

#[test]
fn a_shared_cloud_prompt_is_held_once() {
    let m = model();
    let p = prefix(&m, SUPPORT);
    let prompt = edge_ids(&m, SUPPORT, QUESTIONS[0]).1;
    let one = usage_with(&m, std::slice::from_ref(&p), &prompt);
    let eight = usage_with(&m, &vec![p.clone(); 8], &prompt);
    assert_eq!(one.sequences, 1);
    assert_eq!(eight.sequences, 8);
    assert_eq!(one.shared_prefix_bytes, p.bytes());
    assert_eq!(one.distinct_prefix_buffers, m.cfg.n_layer);
    // Eight requests: the prefix is still one copy; memory grew by private parts only.
    assert_eq!(eight.shared_prefix_bytes, p.bytes());
    assert_eq!(eight.distinct_prefix_buffers, m.cfg.n_layer);
    assert_eq!(eight.private_bytes, 8 * one.private_bytes);
    let per_token = 2 * 2 * m.cfg.n_layer * m.cfg.n_kv_head * m.cfg.head_dim;
    // After the prefill step the private KV is exactly the private prompt's.
    assert_eq!(one.private_bytes, prompt.len() * per_token);
    // The same count sees copies when they exist (PagedAttention-like, no sharing).
    let copies: Vec<Arc<PrefixKv>> = (0..8)
        .map(|_| {
            Arc::new(PrefixKv {
                layers: p.layers.iter().map(|l| Arc::new((**l).clone())).collect(),
                ..(*p).clone()
            })
        })
        .collect();
    let copied = usage_with(&m, &copies, &prompt);
    assert_eq!(copied.shared_prefix_bytes, 8 * p.bytes());
    eprintln!(
        "KV bytes: 1 request {} + {}; 8 shared {} + {}; 8 copies {} + {}",
        one.shared_prefix_bytes,
        one.private_bytes,
        eight.shared_prefix_bytes,
        eight.private_bytes,
        copied.shared_prefix_bytes,
        copied.private_bytes
    );
}
