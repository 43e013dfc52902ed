//! Private system messages leave nothing on any link. Two edge servers (one serving the other
//! as a peer) and a signing cloud, every link tapped both ways and every request the cloud and
//! the peer port receive recorded, while clients send chats with private system messages (and
//! public ones, so the links carry real traffic). Neither the messages' text, nor their token
//! ids, nor their content address, nor a SHA-256 over them is on any link; the cloud and the
//! peer are asked only for what the cloud publishes; and the peer port answers a held private
//! prompt exactly as a prompt it never saw: NOT_FOUND. Two-turn conversations (the second turn
//! running on the first's KV from the private prefix cache) leave nothing of their private turns
//! on any link either.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgeprompt_cloud::{CloudNode, CloudService};
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::peer::{PeerPolicy, PeerService};
use edgeprompt_edge::prefixes::PrefixConfig;
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_edge::{CloudClient, EdgeError};
use edgeprompt_engine::{Message, Model};
use edgeprompt_kv::{content_address, Codec};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{FetchRequest, ListReply, ListRequest, PromptRef};
use sha2::{Digest, Sha256};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

use crate::common;
use common::{model, post_json, prompt_specs, Tap, CODING, SUPPORT};

/// What a service was asked.
#[derive(Debug, Clone, PartialEq)]
enum Asked {
    List,
    Fetch(Option<PromptRef>),
}

/// A gRPC service that records every request before its real service answers it.
#[derive(Clone)]
struct Recorded<S> {
    inner: S,
    log: Arc<Mutex<Vec<Asked>>>,
}

#[tonic::async_trait]
impl<S: CloudKv> CloudKv for Recorded<S> {
    type FetchStream = S::FetchStream;

    async fn list(&self, req: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        self.log.lock().unwrap().push(Asked::List);
        self.inner.list(req).await
    }

    async fn fetch(&self, req: Request<FetchRequest>) -> Result<Response<S::FetchStream>, Status> {
        let asked = Asked::Fetch(req.get_ref().prompt.clone());
        self.log.lock().unwrap().push(asked);
        self.inner.fetch(req).await
    }
}

/// Serve `svc` recorded on loopback: its URL and its log.
async fn recorded<S: CloudKv>(svc: S) -> (String, Arc<Mutex<Vec<Asked>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let svc = Recorded {
        inner: svc,
        log: log.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudKvServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    (url, log)
}

const PRIVATE: [&str; 2] = [
    "You are the assistant of Dana Whitfield, account 4417, diagnosis: type 2 diabetes. Be brief.",
    "Internal: the merger with Northwind closes on 14 March at 31.50 per share. Never disclose it.",
];

async fn edge(m: &Arc<Model>, cloud: &str, peers: Vec<String>) -> (SocketAddr, Arc<EdgeServer>) {
    let state = EdgeServer::start(
        m.clone(),
        ServerConfig {
            model_id: "smollm2".into(),
            default_max_tokens: 4,
            api_keys: ApiKeys::default(),
        },
        SchedulerConfig {
            request_timeout: Duration::from_secs(120),
            ..Default::default()
        },
        PrefixConfig {
            peers,
            ..common::prefix_config(cloud)
        },
    )
    .unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(serve(l, state.clone()));
    (addr, state)
}

/// A conversation's private user turns: the second asks after the first.
const TURNS: [&str; 2] = [
    "My passport number is XK8830192 and I travel to Valparaiso tomorrow.",
    "Which passport number did I mention, and where am I travelling?",
];

/// A two-turn conversation on `system` under `salt`; returns both turns' replies and the
/// whole second prompt's ids, as the edge renders it.
fn two_turns(
    m: &Model,
    edge: SocketAddr,
    system: &str,
    salt: &str,
) -> ([serde_json::Value; 2], Vec<u32>) {
    // Greedy: a sampled answer may be tokens that its text does not tokenize back to, and
    // such a turn (rightly) misses the cache.
    let ask = |messages: &serde_json::Value| {
        let body = serde_json::json!({
            "model": "smollm2", "messages": messages, "max_tokens": 8, "temperature": 0, "cache_salt": salt,
        });
        let (status, reply) = post_json(edge, "/v1/chat/completions", &body.to_string());
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let mut messages = serde_json::json!([
        {"role": "system", "content": system},
        {"role": "user", "content": TURNS[0]},
    ]);
    let first = ask(&messages);
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let list = messages.as_array_mut().unwrap();
    list.push(serde_json::json!({"role": "assistant", "content": answer.clone()}));
    list.push(serde_json::json!({"role": "user", "content": TURNS[1]}));
    let second = ask(&messages);
    let chat = m.chat.as_ref().unwrap();
    let rendered = chat
        .render(
            &[
                Message::new("system", system),
                Message::new("user", TURNS[0]),
                Message::new("assistant", &answer),
                Message::new("user", TURNS[1]),
            ],
            true,
        )
        .unwrap();
    ([first, second], m.tokenizer.encode(&rendered).unwrap())
}

/// Every byte string a conversation's private turns could show themselves as on a link:
/// their words, hashes and addresses of the whole prompt, and runs of its private ids.
fn turn_traces(m: &Model, system: &str, ids: &[u32]) -> Vec<(String, Vec<u8>)> {
    let public = system_ids(m, system).len();
    let le: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    let mut t = vec![
        (
            "the conversation's address".to_string(),
            hex::decode(content_address(&m.fingerprint, ids)).unwrap(),
        ),
        ("SHA-256 of its ids".into(), Sha256::digest(&le).to_vec()),
    ];
    for turn in TURNS {
        t.push(("SHA-256 of a turn".into(), Sha256::digest(turn).to_vec()));
        for w in turn.split_whitespace().filter(|w| w.len() >= 6) {
            t.push((format!("the word {w:?}"), w.as_bytes().to_vec()));
        }
    }
    // Runs of four ids; a varint run shorter than 6 bytes (small ids: punctuation) would
    // match KV bytes by chance, so it is left out.
    for w in ids[public..ids.len() - 2].windows(4) {
        let le: Vec<u8> = w.iter().flat_map(|i| i.to_le_bytes()).collect();
        t.push((format!("ids {w:?} (u32)"), le));
        let v = varint(w);
        if v.len() >= 6 {
            t.push((format!("ids {w:?} (varint)"), v));
        }
    }
    t
}

fn chat(system: &str) -> String {
    serde_json::json!({
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "What should I do next?"}
        ],
        "max_tokens": 4
    })
    .to_string()
}

/// The rendered system turn's token ids, as the edge tokenizes it.
fn system_ids(m: &Model, system: &str) -> Vec<u32> {
    let chat = m.chat.as_ref().unwrap();
    let text = chat
        .render(&[Message::new("system", system)], false)
        .unwrap();
    m.tokenizer.encode(&text).unwrap()
}

fn varint(ids: &[u32]) -> Vec<u8> {
    let mut out = Vec::new();
    for &id in ids {
        let mut v = id;
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    out
}

/// Every byte string a private system message could show itself as on a link.
fn traces(m: &Model, system: &str) -> Vec<(String, Vec<u8>)> {
    let ids = system_ids(m, system);
    let address = content_address(&m.fingerprint, &ids);
    let le: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    let mut t = vec![
        ("address (hex)".to_string(), address.as_bytes().to_vec()),
        ("address".into(), hex::decode(&address).unwrap()),
        (
            "SHA-256 of the text".into(),
            Sha256::digest(system).to_vec(),
        ),
        ("SHA-256 of the ids".into(), Sha256::digest(&le).to_vec()),
    ];
    for w in system.split_whitespace().filter(|w| w.len() >= 4) {
        t.push((format!("the word {w:?}"), w.as_bytes().to_vec()));
    }
    // Runs of three ids in any plausible encoding (the template's own tokens aside: the
    // runs are taken inside the message's own part).
    for w in ids[ids.len() / 3..ids.len() - 2].windows(3) {
        let le: Vec<u8> = w.iter().flat_map(|i| i.to_le_bytes()).collect();
        t.push((format!("ids {w:?} (u32)"), le));
        t.push((format!("ids {w:?} (varint)"), varint(w)));
    }
    t
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn private_system_messages_leave_nothing_on_any_link_and_the_peer_port_is_no_oracle() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = Arc::new(CloudNode::new(m.clone(), &prompt_specs(), 64 << 20).unwrap());
        let (cloud, cloud_log) = recorded(CloudService(node)).await;
        let (tap_a, tap_b) = (Tap::start(&cloud).await, Tap::start(&cloud).await);
        // Edge A serves peers; edge B asks A (through a tap) before the cloud.
        let (a, a_state) = edge(&m, &tap_a.url, vec![]).await;
        let peer = PeerService::new(a_state.prefixes.clone(), PeerPolicy::default());
        let (peer_url, peer_log) = recorded(peer).await;
        let tap_peer = Tap::start(&peer_url).await;
        let (b, _) = edge(&m, &tap_b.url, vec![tap_peer.url.clone()]).await;

        let systems = [PRIVATE[0], PRIVATE[1], SUPPORT, CODING];
        for edge in [a, b] {
            // Each twice: cold, then held in memory.
            for system in systems.iter().chain(&systems) {
                let (status, body) = tokio::task::spawn_blocking({
                    let body = chat(system);
                    move || post_json(edge, "/v1/chat/completions", &body)
                })
                .await
                .unwrap();
                assert_eq!(status, 200, "{body}");
                let source = body["edgeprompt"]["cloud_prompt"]["source"].clone();
                let public = *system == SUPPORT || *system == CODING;
                if !public {
                    assert!(
                        source == "local" || source == "memory",
                        "a private system message is computed here ({source})"
                    );
                }
            }
        }

        // Two-turn conversations, on a public cloud prompt and on a private system message:
        // the second turn runs on the first's kept KV, and nothing of either turn leaves.
        let mut conversations = Vec::new();
        for (e, edge) in [a, b].into_iter().enumerate() {
            for system in [SUPPORT, PRIVATE[0]] {
                let m2 = m.clone();
                let salt = format!("tenant-{e}");
                let ([first, reply], ids) =
                    tokio::task::spawn_blocking(move || two_turns(&m2, edge, system, &salt))
                        .await
                        .unwrap();
                let kept = reply["edgeprompt"]["private_cached_tokens"]
                    .as_u64()
                    .unwrap_or(0);
                assert!(
                    kept > 0,
                    "turn two ran on turn one's kept KV:\n{first}\n{reply}"
                );
                conversations.push((system, ids));
            }
        }

        let published: Vec<String> = [SUPPORT, CODING]
            .iter()
            .map(|s| content_address(&m.fingerprint, &system_ids(&m, s)))
            .collect();
        let public_ref = |r: &Option<PromptRef>| match r {
            Some(PromptRef::Id(id)) => id == "support" || id == "coding",
            Some(PromptRef::ContentAddress(a)) => published.contains(&hex::encode(a)),
            None => false,
        };
        for (who, log) in [("cloud", &cloud_log), ("peer port", &peer_log)] {
            let log = log.lock().unwrap().clone();
            println!("{who} was asked: {log:?}");
            for asked in &log {
                if let Asked::Fetch(r) = asked {
                    assert!(public_ref(r), "{who} was asked for {r:?}: not published");
                }
            }
        }
        let cloud_asks = cloud_log.lock().unwrap().clone();
        assert!(
            cloud_asks.contains(&Asked::List),
            "the edges read the cloud's list"
        );
        assert!(
            cloud_asks.iter().any(|a| matches!(a, Asked::Fetch(_))),
            "published prompts were fetched: the taps saw real traffic"
        );

        let links = [
            ("A to cloud", &tap_a),
            ("B to cloud", &tap_b),
            ("B to A", &tap_peer),
        ];
        let mut total = 0;
        for (link, tap) in links {
            let bytes = tap.bytes();
            total += bytes.len();
            for system in PRIVATE {
                for (what, needle) in traces(&m, system) {
                    assert!(!contains(&bytes, &needle), "{link}: {what} is on the link");
                }
            }
            for (system, ids) in &conversations {
                for (what, needle) in turn_traces(&m, system, ids) {
                    assert!(
                        !contains(&bytes, &needle),
                        "{link}: a private turn's {what} is on the link"
                    );
                }
            }
        }
        // The capture does see what is public: a published prompt's address went up.
        let public_address = hex::decode(&published[0]).unwrap();
        assert!(
            links
                .iter()
                .any(|(_, t)| contains(&t.up.lock().unwrap(), &public_address)),
            "the taps see the requests"
        );
        println!(
            "{total} bytes captured on 3 links; no trace of the private system messages or turns"
        );

        // The peer port, asked directly as an attacker would: A holds both private prompts,
        // and answers them exactly as an address it never saw.
        let mut answers = Vec::new();
        let random = [7u8; 32].to_vec();
        let private = hex::decode(content_address(&m.fingerprint, &system_ids(&m, PRIVATE[0])));
        for address in [private.unwrap(), random] {
            let mut c = CloudClient::connect(&peer_url).await.unwrap();
            let got = c
                .fetch(&m, PromptRef::ContentAddress(address), &[Codec::F16], false)
                .await;
            match got {
                Err(EdgeError::NotFound(msg)) => answers.push(msg),
                Err(e) => panic!("expected NOT_FOUND, got {e}"),
                Ok(_) => panic!("the peer port served a private prompt"),
            }
        }
        assert_eq!(answers[0], answers[1], "held or not, the same answer");
        // A published prompt it holds is served.
        let mut c = CloudClient::connect(&peer_url).await.unwrap();
        let public = PromptRef::ContentAddress(public_address);
        assert!(c.fetch(&m, public, &[Codec::F16], false).await.is_ok());
    });
}
