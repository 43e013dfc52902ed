//! Tenants on one edge learn nothing of each other's private system messages. Tenant A chats
//! with a private system message; tenant B (another API key, or another `cache_salt` under one
//! key or on an open API) sends the same text: it is computed anew, labelled as a text nobody
//! sent, and takes as long (the two timings' ranges over 20 trials overlap; their medians are
//! printed, nothing absolute is asserted). A itself runs on its own KV. `/metrics` counts a
//! private lookup the same whether it was held or computed, and answers only the admin key
//! when API keys are set. (Callers with neither key nor salt are one tenant: nothing tells
//! them apart.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_engine::Model;
use serde_json::{json, Value};

use crate::common;
use common::model;

async fn edge(m: &Arc<Model>, cloud: &str, api_keys: ApiKeys) -> SocketAddr {
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 1,
            api_keys,
        },
        SchedulerConfig {
            request_timeout: Duration::from_secs(120),
            ..Default::default()
        },
        common::prefix_config(cloud),
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, state));
    addr
}

/// A request as `key` (none: no `Authorization`): status, body, and how long it took.
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (u16, String, Duration) {
    use std::io::{Read, Write};
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let auth = key.map_or(String::new(), |k| format!("authorization: Bearer {k}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n{auth}\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let took = t.elapsed();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    (status, body, took)
}

/// A private system message of a realistic length (~150 tokens), one per `n`.
fn secret(n: usize) -> String {
    format!(
        "You are the private assistant of patient {n:05}. Their record: diagnosis code \
         E11.{n:03}, prescribed metformin 500 mg twice daily, last HbA1c 7.{n} percent, \
         allergies to penicillin and latex, emergency contact reachable after six in the \
         evening, insurance member {n:08}, home clinic on the north side, appointments on \
         Tuesdays. Answer their questions about medication timing, diet and follow-up visits \
         in plain words, never more than three sentences, and remind them to call the clinic \
         for anything urgent. Do not repeat the record back to them unless they ask for it."
    )
}

/// Who sends: an API key and a salt.
#[derive(Clone, Copy)]
struct Caller {
    key: Option<&'static str>,
    salt: Option<&'static str>,
}

/// A chat as `who` with `system`: its `edgeprompt.cloud_prompt.source` and how long it took.
fn chat(addr: SocketAddr, who: Caller, system: &str) -> (String, Duration) {
    let mut body = json!({
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "When do I take it?"},
        ],
        "max_tokens": 1,
        "temperature": 0,
    });
    if let Some(s) = who.salt {
        body["cache_salt"] = json!(s);
    }
    let (status, text, took) = call(
        addr,
        "POST",
        "/v1/chat/completions",
        who.key,
        &body.to_string(),
    );
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let source = v["edgeprompt"]["cloud_prompt"]["source"]
        .as_str()
        .unwrap()
        .to_string();
    (source, took)
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_tenants_private_system_message_is_as_new_as_a_text_nobody_sent() {
    let m = model();
    let cloud = common::start_cloud(m.clone()).await;
    let keys = ApiKeys::new(vec!["sk-a".into(), "sk-b".into()], None)
        .unwrap()
        .with_admin(&["sk-admin".into()])
        .unwrap();
    let keyed = edge(&m, &cloud, keys).await;
    let open = edge(&m, &cloud, ApiKeys::default()).await;
    tokio::task::spawn_blocking(move || {
        let cases = [
            (
                "two API keys",
                keyed,
                Caller {
                    key: Some("sk-a"),
                    salt: None,
                },
                Caller {
                    key: Some("sk-b"),
                    salt: None,
                },
            ),
            (
                "one key, two salts",
                keyed,
                Caller {
                    key: Some("sk-a"),
                    salt: Some("alice"),
                },
                Caller {
                    key: Some("sk-a"),
                    salt: Some("bob"),
                },
            ),
            (
                "open API, two salts",
                open,
                Caller {
                    key: None,
                    salt: Some("alice"),
                },
                Caller {
                    key: None,
                    salt: Some("bob"),
                },
            ),
        ];
        const TRIALS: usize = 20;
        for (c, (name, addr, a, b)) in cases.into_iter().enumerate() {
            let (mut other, mut fresh) = (Vec::new(), Vec::new());
            for t in 0..TRIALS {
                // Each trial's texts are new to the edge: A's secret, and one nobody sent.
                let mine = secret(2 * (c * TRIALS + t));
                let nobodys = secret(2 * (c * TRIALS + t) + 1);
                assert_eq!(chat(addr, a, &mine).0, "local", "{name}");
                // A runs on its own KV again.
                assert_eq!(chat(addr, a, &mine).0, "memory", "{name}");
                // B: A's text and a new one, in alternating order.
                let (s1, t1) = chat(addr, b, if t % 2 == 0 { &mine } else { &nobodys });
                let (s2, t2) = chat(addr, b, if t % 2 == 0 { &nobodys } else { &mine });
                assert_eq!((s1.as_str(), s2.as_str()), ("local", "local"), "{name}");
                let (o, f) = if t % 2 == 0 { (t1, t2) } else { (t2, t1) };
                other.push(o);
                fresh.push(f);
            }
            let range = |v: &[Duration]| (*v.iter().min().unwrap(), *v.iter().max().unwrap());
            let (o, f) = (range(&other), range(&fresh));
            eprintln!(
                "{name}: another tenant's text median {:?} (range {:?}-{:?}); a new text \
                 median {:?} (range {:?}-{:?}), {TRIALS} trials",
                median(&other),
                o.0,
                o.1,
                median(&fresh),
                f.0,
                f.1
            );
            // Both are computed here: their ranges overlap (a hit would sit far below).
            assert!(
                o.0 <= f.1 && f.0 <= o.1,
                "{name}: another tenant's text {o:?} vs a new one {f:?}"
            );
        }

        // The counters do not tell a held private prompt from a computed one.
        let (status, text, _) = call(open, "GET", "/metrics", None, "");
        assert_eq!(status, 200, "an open API's metrics stay open");
        assert!(
            text.contains("edgeprompt_prefix_lookups_total{source=\"private\"}"),
            "{text}"
        );
        assert!(
            !text.contains("source=\"memory\"") && !text.contains("source=\"local\""),
            "private lookups counted by where they came from:\n{text}"
        );
        // With API keys, the metrics answer the admin key only.
        for key in [None, Some("sk-a"), Some("guess")] {
            let (status, text, _) = call(keyed, "GET", "/metrics", key, "");
            assert_eq!(status, 401, "{key:?}: {text}");
        }
        let (status, text, _) = call(keyed, "GET", "/metrics", Some("sk-admin"), "");
        assert_eq!(status, 200, "{text}");
        // The admin key is not an API key.
        let (status, _, _) = call(keyed, "GET", "/v1/models", Some("sk-admin"), "");
        assert_eq!(status, 401);
    })
    .await
    .unwrap();
}
