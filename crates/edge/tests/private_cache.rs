//! The private prefix cache end to end: a conversation's second turn on an edge that kept the
//! first turn's KV answers exactly as an edge that keeps nothing (token for token, every
//! log-probability), alone and in a batch, after a cloud prompt that was cold at turn one and
//! after a private system message; a caller never reads another's entries (another API key,
//! another `cache_salt`); and the cache stays within its budget under a flood of conversations,
//! which evicts the flooding caller's own conversations before another's.
//! A turn that parts from the kept tokens mid-way runs on the positions before the difference.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;
use serde_json::{json, Value};

use crate::common;
use common::{model, CODING, SUPPORT};

const PRIVATE: &str = "You are the assistant of Dana Whitfield, account 4417. Be brief.";

async fn edge(
    m: &Arc<Model>,
    cloud: &str,
    private_cache_bytes: usize,
) -> (SocketAddr, Arc<EdgeServer>) {
    let keys = ApiKeys::new(vec!["sk-a".into(), "sk-b".into()], None).unwrap();
    edge_with(m, cloud, private_cache_bytes, keys).await
}

async fn edge_with(
    m: &Arc<Model>,
    cloud: &str,
    private_cache_bytes: usize,
    api_keys: ApiKeys,
) -> (SocketAddr, Arc<EdgeServer>) {
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 8,
            api_keys,
        },
        SchedulerConfig {
            request_timeout: Duration::from_secs(120),
            private_cache_bytes,
            ..Default::default()
        },
        common::prefix_config(cloud),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, state.clone()));
    (addr, state)
}

/// POST a chat as `key`: the answer's JSON.
fn post(addr: SocketAddr, key: &str, body: &Value) -> Value {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         authorization: Bearer {key}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, text) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{text}");
    serde_json::from_str(text).unwrap()
}

fn turn(messages: &[(&str, &str)], salt: Option<&str>) -> Value {
    let mut v = json!({
        "model": "smollm2",
        "messages": messages.iter().map(|(r, c)| json!({"role": r, "content": c})).collect::<Vec<_>>(),
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": true,
        "top_logprobs": 3,
    });
    if let Some(s) = salt {
        v["cache_salt"] = json!(s);
    }
    v
}

fn answer(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

fn cached(v: &Value) -> u64 {
    let b = &v["edgeprompt"];
    let n = b["private_cached_tokens"].as_u64().unwrap();
    // The block accounts for the whole prompt, held or computed now.
    let cloud = b["cloud_prompt"]["tokens"].as_u64().unwrap_or(0);
    assert_eq!(
        cloud + b["private_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{b}"
    );
    n
}

/// What must match bit for bit: the text and every log-probability as sent.
fn bits(v: &Value) -> (String, String) {
    (answer(v), v["choices"][0]["logprobs"].to_string())
}

/// Turn one's messages and the second turn's, given turn one's answer.
fn second(system: &str, a1: &str) -> Vec<(&'static str, String)> {
    vec![
        ("system", system.to_string()),
        ("user", "Can I change my seat?".to_string()),
        ("assistant", a1.to_string()),
        ("user", "And what about my bike?".to_string()),
    ]
}

fn refs<'a>(m: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    m.iter().map(|(r, c)| (*r, c.as_str())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_turn_on_kept_kv_is_the_answer_without_it_and_stays_with_its_caller() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    let (warm, state) = edge(&m, &cloud, 64 << 20).await;
    let (cold, _) = edge(&m, &cloud, 0).await;
    tokio::task::spawn_blocking(move || {
        for system in [SUPPORT, CODING, PRIVATE] {
            let first = [("system", system), ("user", "Can I change my seat?")];
            // Turn one: the cloud prompt is cold on both edges.
            let (w1, c1) = (
                post(warm, "sk-a", &turn(&first, None)),
                post(cold, "sk-a", &turn(&first, None)),
            );
            assert_eq!(bits(&w1), bits(&c1));
            assert_eq!(cached(&w1), 0);
            let msgs = second(system, &answer(&w1));
            let t2 = turn(&refs(&msgs), None);
            let (w2, c2) = (post(warm, "sk-a", &t2), post(cold, "sk-a", &t2));
            assert_eq!(
                bits(&w2),
                bits(&c2),
                "{system:?}: turn two differs with the cache"
            );
            assert!(
                cached(&w2) > 4,
                "{system:?}: turn two ran on turn one's KV: {}",
                w2["edgeprompt"]
            );
            assert_eq!(cached(&c2), 0);
            // Another key, or the same key with a salt, reads nothing of it.
            assert_eq!(cached(&post(warm, "sk-b", &t2)), 0, "another key hit");
            let salted = turn(&refs(&msgs), Some("tenant-7"));
            assert_eq!(cached(&post(warm, "sk-a", &salted)), 0, "another salt hit");
            assert_eq!(bits(&post(warm, "sk-a", &salted)), bits(&c2));
        }
        // Second turns of three conversations at once (a batch of hits and misses) against
        // each alone on the edge that keeps nothing.
        let systems = [SUPPORT, CODING, PRIVATE];
        let firsts: Vec<String> = systems
            .iter()
            .map(|s| {
                answer(&post(
                    cold,
                    "sk-b",
                    &turn(
                        &[("system", s), ("user", "Can I change my seat?")],
                        Some("b"),
                    ),
                ))
            })
            .collect();
        let bodies: Vec<Value> = systems
            .iter()
            .zip(&firsts)
            .map(|(s, a1)| turn(&refs(&second(s, a1)), Some("b")))
            .collect();
        for b in &bodies {
            // Turn one again on the warm edge, so its KV is kept for this scope.
            let first: Vec<Value> = b["messages"].as_array().unwrap()[..2].to_vec();
            let mut t1 = b.clone();
            t1["messages"] = json!(first);
            post(warm, "sk-b", &t1);
        }
        let together: Vec<Value> = std::thread::scope(|sc| {
            let hs: Vec<_> = bodies
                .iter()
                .map(|b| sc.spawn(move || post(warm, "sk-b", b)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (b, w) in bodies.iter().zip(&together) {
            assert_eq!(
                bits(w),
                bits(&post(cold, "sk-b", b)),
                "batched turn two differs"
            );
            assert!(cached(w) > 0);
        }
        assert!(state.private.bytes() <= 64 << 20);
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_conversations_stays_within_the_budget() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    // Room for a few conversations only.
    let budget = 10 << 20;
    let (warm, state) = edge(&m, &cloud, budget).await;
    tokio::task::spawn_blocking(move || {
        // Another caller's conversation, older than every one of the flood's.
        let first = [("system", SUPPORT), ("user", "Can I change my seat?")];
        let a1 = answer(&post(warm, "sk-b", &turn(&first, None)));
        let one = state.private.bytes();
        assert!(
            3 * one <= budget && 24 * one / 2 > budget,
            "{one} bytes a conversation"
        );
        for i in 0..24 {
            let user = format!("Question {i}: is ticket {} refundable?", 1000 + i);
            post(
                warm,
                "sk-a",
                &turn(&[("system", SUPPORT), ("user", &user)], None),
            );
            assert!(
                state.private.bytes() <= budget,
                "{} bytes",
                state.private.bytes()
            );
        }
        assert!(!state.private.is_empty());
        assert!(state.private.len() < 24, "least recently used dropped");
        // The flooding caller dropped its own conversations: the other's next turn still
        // runs on what it kept.
        let t2 = post(warm, "sk-b", &turn(&refs(&second(SUPPORT, &a1)), None));
        assert!(cached(&t2) > 4, "{}", t2["edgeprompt"]);
    })
    .await
    .unwrap();
}

/// Conversations on one cloud prompt hold its KV once: the first keeps the cloud prompt and its
/// own positions, each further one only its own (the cloud prompt's KV is held, not copied).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conversations_on_one_cloud_prompt_hold_its_kv_once() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    let (warm, state) = edge(&m, &cloud, 64 << 20).await;
    let per_token = edgeprompt_edge::scheduler::kv_bytes_per_token(&m);
    tokio::task::spawn_blocking(move || {
        let mut held = Vec::new();
        let mut before = 0;
        for (i, key) in ["sk-a", "sk-b", "sk-a"].into_iter().enumerate() {
            let user = format!("Question {i}: may I bring a dog?");
            let r = post(
                warm,
                key,
                &turn(&[("system", SUPPORT), ("user", &user)], None),
            );
            let b = &r["edgeprompt"];
            let cloud_tokens = b["cloud_prompt"]["tokens"].as_u64().unwrap() as usize;
            let private = b["private_tokens"].as_u64().unwrap() as usize;
            let answered = r["usage"]["completion_tokens"].as_u64().unwrap() as usize;
            assert!(cloud_tokens > private, "{b}");
            let added = state.private.bytes() - before;
            before = state.private.bytes();
            // Its own prompt and answer (the last token drawn is not run), and the cloud
            // prompt's KV with the first conversation only.
            let shared = if i == 0 { cloud_tokens } else { 0 };
            assert!(
                added >= (shared + private) * per_token
                    && added <= (shared + private + answered) * per_token,
                "conversation {i} added {added} bytes ({shared} + {private} + {answered} tokens)"
            );
            held.push(added);
        }
        assert_eq!(state.private.len(), 3);
        assert!(held[1] + held[2] < held[0], "{held:?}");
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_an_open_api_only_a_salted_conversation_is_kept() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    let (open, state) = edge_with(&m, &cloud, 64 << 20, ApiKeys::default()).await;
    tokio::task::spawn_blocking(move || {
        let first = [("system", SUPPORT), ("user", "Can I change my seat?")];
        for salt in [None, Some("tab-1")] {
            let a1 = answer(&post(open, "none", &turn(&first, salt)));
            let t2 = post(open, "none", &turn(&refs(&second(SUPPORT, &a1)), salt));
            match salt {
                // Callers without a name cannot be told apart: nothing kept, nothing read.
                None => {
                    assert_eq!(cached(&t2), 0);
                    assert!(state.private.is_empty());
                }
                Some(_) => assert!(cached(&t2) > 4, "{}", t2["edgeprompt"]),
            }
        }
    })
    .await
    .unwrap();
}

/// A second turn whose earlier answer is not the tokens the edge kept (the client edited it, or
/// its text re-tokenizes differently) runs on the kept positions before the difference: fewer
/// cached tokens than the whole turn, more than the first user message, and the answer of an
/// edge that keeps nothing, bit for bit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_that_parts_from_the_kept_answer_runs_on_what_it_shares() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    let (warm, _) = edge(&m, &cloud, 64 << 20).await;
    let (cold, _) = edge(&m, &cloud, 0).await;
    tokio::task::spawn_blocking(move || {
        let first = [("system", SUPPORT), ("user", "Can I change my seat?")];
        let a1 = answer(&post(warm, "sk-a", &turn(&first, Some("whole"))));
        let whole = post(
            warm,
            "sk-a",
            &turn(&refs(&second(SUPPORT, &a1)), Some("whole")),
        );
        post(warm, "sk-a", &turn(&first, Some("edited")));
        let words: Vec<&str> = a1.split(' ').collect();
        assert!(words.len() > 2, "{a1:?}");
        let edited = format!("{} perhaps not", words[..words.len() / 2].join(" "));
        let t2 = turn(&refs(&second(SUPPORT, &edited)), Some("edited"));
        let (w2, c2) = (post(warm, "sk-a", &t2), post(cold, "sk-a", &t2));
        assert_eq!(
            bits(&w2),
            bits(&c2),
            "turn two on part of the kept turn differs"
        );
        let (part, all) = (cached(&w2), cached(&whole));
        assert!(
            part > 4 && part < all,
            "cached {part} of the edited turn, {all} of the whole"
        );
        assert_eq!(cached(&c2), 0);
    })
    .await
    .unwrap();
}
