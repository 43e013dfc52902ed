//! A panic in the scheduler's step is contained: the requests in that step end with a clear
//! error and their KV is given back, the next requests are answered as a fresh server answers
//! them; faults that repeat make the scheduler dead, and `/health` and `/ready` say so (503)
//! for an orchestrator to restart the edge. Real SmolLM2, a real cloud node on loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::{SchedulerConfig, DEAD, FAULT, FAULTS_TO_DIE};
use serde_json::{json, Value};

use crate::common;
use common::{model, start_cloud, SUPPORT};

const USER: &str = "My train was cancelled. What can I do with my ticket?";

async fn start(cloud: &str) -> (SocketAddr, Arc<EdgeServer>) {
    let state = EdgeServer::start(
        model(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 16,
            api_keys: Default::default(),
        },
        SchedulerConfig {
            request_timeout: Duration::from_secs(120),
            ..SchedulerConfig::default()
        },
        common::prefix_config(cloud),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state.clone()));
    (addr, state)
}

/// A greedy chat request with every token's log-probability (so equal answers mean equal
/// tokens, bit for bit).
fn body(stream: bool) -> String {
    json!({
        "model": "smollm2", "max_tokens": 12, "temperature": 0, "stream": stream,
        "logprobs": true, "top_logprobs": 2,
        "messages": [{"role": "system", "content": SUPPORT}, {"role": "user", "content": USER}]
    })
    .to_string()
}

async fn get(
    addr: SocketAddr,
    method: &'static str,
    path: &'static str,
    b: String,
) -> (u16, String) {
    tokio::task::spawn_blocking(move || common::http(addr, method, path, &b))
        .await
        .unwrap()
}

async fn chat(addr: SocketAddr, stream: bool) -> (u16, String) {
    get(addr, "POST", "/v1/chat/completions", body(stream)).await
}

/// What an answer says, without what differs between servers and requests.
fn answer(text: &str) -> Value {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    json!({"choices": v["choices"], "usage": v["usage"]})
}

/// Wait until the failed requests have given back their KV and their place.
async fn nothing_held(s: &EdgeServer) {
    let t = Instant::now();
    while s.scheduler.pending() > 0 || s.scheduler.reserved_bytes() > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "{} requests, {} bytes still held",
            s.scheduler.pending(),
            s.scheduler.reserved_bytes()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn alive(addr: SocketAddr) {
    for path in ["/health", "/ready"] {
        let (status, b) = get(addr, "GET", path, String::new()).await;
        assert_eq!(status, 200, "{path}: {b}");
    }
}

/// After a contained fault: nothing held, the scheduler alive, health and readiness 200, and
/// the next request answered token for token as `want`.
async fn recovered(s: &EdgeServer, addr: SocketAddr, want: &Value) {
    nothing_held(s).await;
    assert_eq!(s.scheduler.dead(), None);
    alive(addr).await;
    let (status, b) = chat(addr, false).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(&answer(&b), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_step_fails_its_requests_and_repeated_faults_make_the_edge_dead() {
    let cloud = start_cloud(model()).await;
    let (fresh, _fresh_state) = start(&cloud).await;
    let (addr, s) = start(&cloud).await;
    let (status, want) = chat(fresh, false).await;
    assert_eq!(status, 200, "{want}");
    let want = answer(&want);
    assert_eq!(FAULTS_TO_DIE, 3, "the steps below count to three");

    // Fault 1: the whole answer is a 500 that says what happened; nothing stays held.
    s.scheduler.inject_panic_next_step();
    let (status, b) = chat(addr, false).await;
    assert_eq!(status, 500, "{b}");
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["error"]["message"], FAULT, "{b}");
    assert_eq!(v["error"]["type"], "server_error", "{b}");
    // Nothing held, still alive, and the next request served as on a fresh server.
    recovered(&s, addr, &want).await;

    // Fault 2, streamed: the stream carries the error, then ends.
    s.scheduler.inject_panic_next_step();
    let (status, b) = chat(addr, true).await;
    assert_eq!(status, 200, "the stream had started: {b}");
    assert!(b.contains(FAULT), "{b}");
    assert!(!b.contains("finish_reason\":\"length"), "{b}");
    recovered(&s, addr, &want).await;

    // Fault 3 within the minute: no longer contained. Its request still gets the fault's
    // error; then the scheduler is dead and says so everywhere.
    s.scheduler.inject_panic_next_step();
    let (status, b) = chat(addr, false).await;
    assert_eq!(status, 500, "{b}");
    assert!(b.contains(FAULT), "{b}");
    let why = tokio::time::timeout(Duration::from_secs(60), s.scheduler.wait_dead())
        .await
        .expect("the scheduler is dead after three faults");
    assert!(why.starts_with(DEAD), "{why}");
    assert_eq!(s.scheduler.dead().as_deref(), Some(why.as_str()));
    nothing_held(&s).await;
    for path in ["/health", "/ready"] {
        let (status, b) = get(addr, "GET", path, String::new()).await;
        assert_eq!(status, 503, "{path}: {b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["reason"], why.as_str(), "{path}: {b}");
    }
    let (status, b) = chat(addr, false).await;
    assert_eq!(status, 503, "{b}");
    assert!(b.contains(DEAD), "{b}");
    // The other server never faulted.
    alive(fresh).await;
}
