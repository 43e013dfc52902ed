//! The bounds admission keeps (queue length, KV budget) and how a stopped scheduler ends its
//! requests, with the real SmolLM2 model.

use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::scheduler::{
    kv_bytes_per_token, Event, Job, Refusal, Scheduler, SchedulerConfig, STOPPED,
};
use edgeprompt_engine::SamplingParams;
use tokio::sync::mpsc;

use crate::common;
use common::model;

fn job(max_tokens: usize) -> (Job, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let j = Job {
        prefix: None,
        prompt: vec![1, 2, 3, 4],
        max_tokens,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        events: tx,
    };
    (j, rx)
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(120), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn the_queue_bound_refuses_with_429_and_frees_when_requests_end() {
    let m = model();
    let cfg = SchedulerConfig {
        max_batch: 1,
        max_queue: 2,
        ..SchedulerConfig::default()
    };
    let s = Scheduler::start(m.clone(), cfg, Arc::new(Metrics::new())).unwrap();
    // Three long requests fill the batch slot and the queue of two; a fourth is refused.
    let mut rxs = Vec::new();
    for _ in 0..3 {
        let (j, rx) = job(4000);
        s.submit(j).expect("admitted");
        rxs.push(rx);
    }
    assert_eq!(s.pending(), 3);
    let (j, _rx) = job(4);
    match s.submit(j) {
        Err(Refusal::Full { reason, .. }) => assert!(reason.contains("queue"), "{reason}"),
        other => panic!("expected a full queue, got {other:?}"),
    }
    // A refused request holds nothing.
    assert_eq!(s.pending(), 3);
    assert_eq!(s.reserved_bytes(), 3 * 4004 * kv_bytes_per_token(&m));
    // Clients going away free their places.
    rxs.clear();
    wait_until("cancelled requests are reaped", || s.pending() == 0);
    assert_eq!(s.reserved_bytes(), 0);
    let (j, mut rx) = job(2);
    s.submit(j).expect("admitted again");
    wait_until("the short request ends", || s.pending() == 0);
    let mut done = false;
    while let Ok(ev) = rx.try_recv() {
        done |= matches!(ev, Event::Done(_));
    }
    assert!(done);
}

#[test]
fn a_stopped_scheduler_ends_every_request_with_the_reason_and_admits_none() {
    let m = model();
    let cfg = SchedulerConfig {
        max_batch: 2,
        ..SchedulerConfig::default()
    };
    let s = Scheduler::start(m, cfg, Arc::new(Metrics::new())).unwrap();
    let mut rxs = Vec::new();
    for _ in 0..4 {
        let (j, rx) = job(4000);
        s.submit(j).expect("admitted");
        rxs.push(rx);
    }
    s.stop();
    wait_until("every request ended", || s.pending() == 0);
    for mut rx in rxs {
        let mut last = None;
        while let Ok(ev) = rx.try_recv() {
            last = Some(ev);
        }
        assert_eq!(last, Some(Event::Failed(STOPPED)));
    }
    assert_eq!(s.submit(job(4).0), Err(Refusal::Stopped));
    assert_eq!(s.reserved_bytes(), 0);
}
