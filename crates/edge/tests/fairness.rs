//! Fair shares of the batch: one client's many long answers cannot hold every slot while
//! another client's request waits. When the batch is full and a client with no slot waits,
//! one of the busiest client's answers steps back to the queue (its KV kept) and resumes
//! later; every answer, paused or not, is the one it gets alone, bit for bit.

use std::net::IpAddr;
use std::sync::Arc;

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{Batcher, Done, Event, Extras, SchedulerConfig};
use edgeprompt_engine::{Model, Sequence};

use crate::common;
use common::{done, edge_ids, job, model, SUPPORT};

const QUESTIONS: [&str; 6] = [
    "How do I get a refund?",
    "Is my train on time?",
    "Can I bring a bike?",
    "What is the fee for late cancellation?",
    "I missed my train, what now?",
    "Do children travel free?",
];

fn batcher(m: &Arc<Model>) -> Batcher {
    let cfg = SchedulerConfig {
        max_batch: 4,
        prefill_chunk: 512,
        ..SchedulerConfig::default()
    };
    Batcher::new(m.clone(), cfg, Arc::new(Metrics::new()))
}

fn from(ip: &str) -> Extras {
    Extras {
        client: Some(ip.parse::<IpAddr>().unwrap()),
        ..Extras::default()
    }
}

#[test]
fn a_client_without_a_slot_is_served_while_another_fills_the_batch_and_answers_keep_their_bits() {
    let m = model();
    let (cloud, _) = edge_ids(&m, SUPPORT, "");
    let prefix = {
        let mut seq = Sequence::new(&m);
        seq.prefill(&m, &cloud).unwrap();
        Arc::new(seq.export_prefix(&m).unwrap())
    };
    let prompts: Vec<Vec<u32>> = QUESTIONS
        .iter()
        .map(|q| edge_ids(&m, SUPPORT, q).1)
        .collect();
    let (long, short) = (48, 6);
    let alone = |prompt: &[u32], n: usize| -> Done {
        let mut b = batcher(&m);
        let (j, mut rx) = job(Some(prefix.clone()), prompt.to_vec(), n);
        b.admit(j).unwrap();
        while !b.is_idle() {
            b.step();
        }
        done(&mut rx)
    };
    let want_long: Vec<Done> = prompts[..5].iter().map(|p| alone(p, long)).collect();
    let want_short = alone(&prompts[5], short);

    // Client A fills the batch (and its queue) with long answers, all decoding.
    let mut b = batcher(&m);
    let mut rx_a = Vec::new();
    for p in &prompts[..5] {
        let (j, rx) = job(Some(prefix.clone()), p.clone(), long);
        b.admit_with(j, from("127.0.0.2")).unwrap();
        rx_a.push(rx);
    }
    for _ in 0..4 {
        b.step();
    }
    // Client B's one short request: served as soon as its prompt and answer take, not after
    // A's answers.
    let (j, mut rx_b) = job(Some(prefix.clone()), prompts[5].clone(), short);
    b.admit_with(j, from("127.0.0.1")).unwrap();
    let mut steps = 0;
    let got_b = loop {
        b.step();
        steps += 1;
        if let Some(d) = finished(&mut rx_b) {
            break d;
        }
        assert!(
            steps < long,
            "B still waits after {steps} steps: A holds the batch"
        );
    };
    assert_eq!(got_b, want_short, "B's answer");
    while !b.is_idle() {
        b.step();
    }
    for (i, (rx, want)) in rx_a.iter_mut().zip(&want_long).enumerate() {
        let got = done(rx);
        assert_eq!(got.token_ids, want.token_ids, "A's answer {i}");
        assert_eq!(got, *want, "A's answer {i}");
    }
    eprintln!("B answered {short} tokens in {steps} steps while A's {long}-token answers ran");
}

/// The answer, once the request is done (`None` while it runs).
fn finished(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> Option<Done> {
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Done(d) => return Some(d),
            Event::Failed(e) => panic!("request failed: {e}"),
            Event::Text(_) => {}
        }
    }
    None
}
