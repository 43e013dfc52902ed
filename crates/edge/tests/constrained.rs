//! Constrained decoding in the batch: an answer held to a JSON schema is the same tokens alone,
//! in a batch of eight, and as a single node computes it without the cloud prompt's KV (the
//! engine's own loop, the reference).

use std::sync::Arc;

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{Batcher, Extras, SchedulerConfig};
use edgeprompt_engine::{Grammars, Model, PrefixKv, Sampler, SamplingParams, Sequence, Spec};
use serde_json::{json, Value};

use crate::common;
use common::{done, edge_ids, job, model, SUPPORT};

const QUESTIONS: [&str; 8] = [
    "Describe a passenger as JSON.",
    "Who travels to Oslo?",
    "A refund request, as JSON.",
    "Make up a traveller.",
    "Who missed the train?",
    "A child's ticket, as JSON.",
    "Someone bringing a bike.",
    "Write a complaint as data.",
];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": {"enum": ["Paris", "Lima", "Oslo"]}
        },
        "required": ["name", "age", "city"],
        "additionalProperties": false
    })
}

fn sampling(i: usize) -> SamplingParams {
    // Half greedy, half drawn at a temperature with their own seeds.
    SamplingParams {
        temperature: if i.is_multiple_of(2) { 0.0 } else { 0.9 },
        seed: 100 + i as u64,
        ..SamplingParams::default()
    }
}

const MAX_TOKENS: usize = 60;

/// The reference: the engine alone, one sequence, the whole prompt computed here.
fn reference(m: &Model, g: &Grammars, ids: &[u32], i: usize) -> Vec<u32> {
    let mut c = g.constraint(&Spec::JsonSchema(schema())).unwrap();
    let mut sampler = Sampler::new(sampling(i));
    let mut seq = Sequence::new(m);
    let mut logits = seq.prefill(m, ids).unwrap();
    let mut out = Vec::new();
    while out.len() < MAX_TOKENS {
        let id = c.draw(&mut sampler, &logits).unwrap();
        if m.tokenizer.stop_ids.contains(&id) {
            break;
        }
        out.push(id);
        logits = seq.prefill(m, &[id]).unwrap();
    }
    out
}

fn batcher(m: &Arc<Model>) -> Batcher {
    let cfg = SchedulerConfig {
        prefill_chunk: 64,
        ..SchedulerConfig::default()
    };
    Batcher::new(m.clone(), cfg, Arc::new(Metrics::new()))
}

#[test]
fn constrained_answers_are_the_same_alone_in_a_batch_and_on_a_single_node() {
    let m = model();
    let g = Grammars::for_model(&m).unwrap();
    let (cloud, _) = edge_ids(&m, SUPPORT, "");
    let prefix: Arc<PrefixKv> = {
        let mut seq = Sequence::new(&m);
        seq.prefill(&m, &cloud).unwrap();
        Arc::new(seq.export_prefix(&m).unwrap())
    };
    let private: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| edge_ids(&m, SUPPORT, q).1)
        .collect();
    let admit = |b: &mut Batcher, i: usize| {
        let (mut j, rx) = job(Some(prefix.clone()), private[i].clone(), MAX_TOKENS);
        j.sampling = sampling(i);
        let extras = Extras {
            constraint: Some(g.constraint(&Spec::JsonSchema(schema())).unwrap()),
            ..Extras::default()
        };
        b.admit_with(j, extras).unwrap();
        rx
    };
    let alone: Vec<Vec<u32>> = (0..QUESTIONS.len())
        .map(|i| {
            let mut b = batcher(&m);
            let mut rx = admit(&mut b, i);
            while !b.is_idle() {
                b.step();
            }
            done(&mut rx).token_ids
        })
        .collect();
    // All eight together, the later ones joining a batch already decoding.
    let mut b = batcher(&m);
    let mut rxs = Vec::new();
    for i in 0..QUESTIONS.len() {
        rxs.push(admit(&mut b, i));
        b.step();
    }
    while !b.is_idle() {
        b.step();
    }
    let mut stops = 0;
    for (i, rx) in rxs.iter_mut().enumerate() {
        let d = done(rx);
        assert_eq!(d.token_ids, alone[i], "request {i}: batch vs alone");
        let whole: Vec<u32> = cloud.iter().chain(&private[i]).copied().collect();
        assert_eq!(
            d.token_ids,
            reference(&m, &g, &whole, i),
            "request {i}: vs single node"
        );
        let text = m.tokenizer.decode(&d.token_ids).unwrap();
        if d.finish_reason == "stop" {
            stops += 1;
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(["Paris", "Lima", "Oslo"].contains(&v["city"].as_str().unwrap()));
            assert!(v["age"].as_i64().is_some_and(|a| (0..=120).contains(&a)));
        }
    }
    // The grammar ends the answers: they close their object well within the budget.
    assert_eq!(stops, QUESTIONS.len());
}

/// `n` > 1: each further answer forks the grammar with the prompt's KV, and answer `k` is the
/// answer the same request gives alone with seed `seed + k`.
#[test]
fn constrained_forks_equal_their_answers_alone() {
    let m = model();
    let g = Grammars::for_model(&m).unwrap();
    let private = edge_ids(&m, SUPPORT, QUESTIONS[3]).1;
    let spec = Spec::JsonSchema(schema());
    let sampled = |seed: u64| SamplingParams {
        temperature: 0.9,
        seed,
        ..SamplingParams::default()
    };
    let run = |seed: u64, forks: usize| {
        let mut b = batcher(&m);
        let (mut j, rx) = job(None, private.clone(), MAX_TOKENS);
        j.sampling = sampled(seed);
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..forks)
            .map(|_| tokio::sync::mpsc::unbounded_channel())
            .unzip();
        let extras = Extras {
            constraint: Some(g.constraint(&spec).unwrap()),
            forks: txs,
            ..Extras::default()
        };
        b.admit_with(j, extras).unwrap();
        while !b.is_idle() {
            b.step();
        }
        std::iter::once(rx)
            .chain(rxs)
            .map(|mut rx| done(&mut rx))
            .collect::<Vec<_>>()
    };
    let together = run(40, 2);
    for (k, answer) in together.iter().enumerate() {
        assert_eq!(
            answer.token_ids,
            run(40 + k as u64, 0)[0].token_ids,
            "answer {k}"
        );
        let text = m.tokenizer.decode(&answer.token_ids).unwrap();
        if answer.finish_reason == "stop" {
            assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text}");
        }
    }
    let ids: Vec<&Vec<u32>> = together.iter().map(|d| &d.token_ids).collect();
    assert!(ids[0] != ids[1] || ids[1] != ids[2], "the seeds differ");
}
