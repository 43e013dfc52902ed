//! Trust on first use against an attacker, and lists that go stale. An attacker who answers an
//! edge's first contact is pinned, and its signed KV used; when the real cloud appears, the
//! edge drops everything the pinned key vouched for, `/health` is no longer ok and `/metrics`
//! shows the conflict, and prompts are computed here (the single node's answer) until an
//! operator settles it. A replayed older list, or an expired one, is refused.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use edgeprompt_cloud::CloudNode;
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes};
use edgeprompt_kv::{content_address, Issued, SealKey};
use edgeprompt_protocol::cloud_kv_server::{CloudKv, CloudKvServer};
use edgeprompt_protocol::{FetchMessage, FetchRequest, ListReply, ListRequest, PromptInfo};
use serde_json::{json, Value};
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::common;
use common::{edge_ids, model, post_json, SUPPORT};

/// A loopback TCP relay whose upstream can be changed: new connections go to the current one.
struct Relay {
    url: String,
    upstream: Arc<Mutex<String>>,
}

impl Relay {
    async fn start(upstream: &str) -> Self {
        let upstream = Arc::new(Mutex::new(
            upstream.trim_start_matches("http://").to_string(),
        ));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let to = upstream.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = l.accept().await {
                let up = to.lock().unwrap().clone();
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&up).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Self { url, upstream }
    }

    fn point_at(&self, url: &str) {
        *self.upstream.lock().unwrap() = url.trim_start_matches("http://").into();
    }
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    common::http(addr, "GET", path, "")
}

fn ask(addr: SocketAddr) -> Value {
    let body = json!({
        "model": "smollm2",
        "messages": [
            {"role": "system", "content": SUPPORT},
            {"role": "user", "content": "Can I bring my bike?"},
        ],
        "max_tokens": 6,
        "temperature": 0,
    });
    let (status, v) = post_json(addr, "/v1/chat/completions", &body.to_string());
    assert_eq!(status, 200, "{v}");
    v
}

fn source(v: &Value) -> String {
    v["edgeprompt"]["cloud_prompt"]["source"]
        .as_str()
        .unwrap()
        .to_string()
}

fn text(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attacker_pinned_on_first_contact_is_dropped_when_the_real_cloud_shows_its_key() {
    let m = model();
    let real = common::start_cloud(m.clone()).await;
    // The attacker serves the same prompts under its own key (what it serves is its choice;
    // whatever it is, only its key vouches for it).
    let forger = common::serve_cloud(Arc::new(
        CloudNode::new(m.clone(), &common::prompt_specs(), 64 << 20)
            .unwrap()
            .with_signing(SealKey::from_seed([66; 32])),
    ))
    .await;
    let relay = Relay::start(&forger).await;
    let addr = common::http_edge(&m, common::prefix_config(&relay.url)).await;
    let single = common::single_node_text(&m, SUPPORT, "Can I bring my bike?", 6);

    let first = tokio::task::spawn_blocking(move || ask(addr))
        .await
        .unwrap();
    assert_eq!(source(&first), "cloud", "{first}");
    let held = tokio::task::spawn_blocking(move || ask(addr))
        .await
        .unwrap();
    assert_eq!(source(&held), "memory", "{held}");
    assert_eq!(get(addr, "/health").0, 200);

    // The real cloud appears on the path: the next list shows its key.
    relay.point_at(&real);
    let until = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let (status, body) = tokio::task::spawn_blocking(move || {
            // A request is what asks for a stale list again.
            let _ = ask(addr);
            get(addr, "/health")
        })
        .await
        .unwrap();
        if status != 200 {
            break body;
        }
        assert!(Instant::now() < until, "no conflict seen: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let h: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(h["status"], "key_conflict", "{h}");
    let reason = h["reason"].as_str().unwrap();
    let forged = SealKey::from_seed([66; 32]).public().to_hex();
    assert!(reason.contains(&forged), "both keys named: {reason}");
    let (status, metrics) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("edgeprompt_trust_conflict 1"), "{metrics}");
    // The forged KV is gone from memory: the prompt is computed here (then held, as a prompt
    // computed here is), the single node's answer; no KV from either key is used while the
    // conflict stands.
    for _ in 0..2 {
        let v = tokio::task::spawn_blocking(move || ask(addr))
            .await
            .unwrap();
        assert!(["local", "memory"].contains(&source(&v).as_str()), "{v}");
        assert_eq!(text(&v), single);
    }
    // Had the forged prompt stayed in memory, nothing would have been computed here.
    let (_, metrics) = get(addr, "/metrics");
    assert!(
        metrics.contains("edgeprompt_prefix_lookups_total{source=\"local\"} "),
        "the prompt was never computed here after the conflict:\n{metrics}"
    );
    assert!(!metrics.contains("edgeprompt_prefix_lookups_total{source=\"local\"} 0"));
}

type FetchStream = Pin<Box<dyn Stream<Item = Result<FetchMessage, Status>> + Send>>;

/// A cloud whose list is set by the test (fetches: not found).
struct Lists(Arc<Mutex<ListReply>>);

#[tonic::async_trait]
impl CloudKv for Lists {
    type FetchStream = FetchStream;

    async fn list(&self, _: Request<ListRequest>) -> Result<Response<ListReply>, Status> {
        Ok(Response::new(self.0.lock().unwrap().clone()))
    }

    async fn fetch(&self, _: Request<FetchRequest>) -> Result<Response<FetchStream>, Status> {
        Err(Status::not_found("no prompts here"))
    }
}

/// The list of `ids` (each SUPPORT's address under another id), signed by `key`, issued
/// `ago` before now.
fn list_of(m: &edgeprompt_engine::Model, key: &SealKey, ids: &[&str], ago: Duration) -> ListReply {
    let (support, _) = edge_ids(m, SUPPORT, "hi");
    let prompts: Vec<PromptInfo> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut ids = support.clone();
            ids.extend(std::iter::repeat_n(1, i));
            PromptInfo {
                id: id.to_string(),
                tokens: ids.len() as u32,
                content_address: hex::decode(content_address(&m.fingerprint, &ids)).unwrap(),
            }
        })
        .collect();
    let entries = edgeprompt_cloud::list_entries(&prompts);
    let issued = Issued {
        unix_ms: (SystemTime::now() - ago)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
        max_age_secs: 300,
    };
    ListReply {
        signature: key.sign_list(&m.fingerprint, &entries).to_vec(),
        fresh_signature: key
            .sign_list_fresh(&m.fingerprint, &entries, issued)
            .to_vec(),
        issued_unix_ms: issued.unix_ms,
        max_age_secs: issued.max_age_secs,
        prompts,
        signing_key: key.public().to_bytes().to_vec(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_older_list_or_an_expired_one_is_refused() {
    let m = model();
    let key = SealKey::from_seed([9; 32]);
    let old = list_of(&m, &key, &["support", "dropped"], Duration::from_secs(60));
    let new = list_of(&m, &key, &["support"], Duration::ZERO);
    let expired = list_of(&m, &key, &["support"], Duration::from_secs(301));
    let mut unstamped = new.clone();
    (unstamped.issued_unix_ms, unstamped.fresh_signature) = (0, Vec::new());
    let served = Arc::new(Mutex::new(new.clone()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CloudKvServer::new(Lists(served.clone())))
            .serve_with_incoming(TcpListenerStream::new(l)),
    );
    let edge = || {
        Arc::new(
            Prefixes::new(
                m.clone(),
                PrefixConfig {
                    cloud_url: Some(url.clone()),
                    ..Default::default()
                },
                Arc::new(Metrics::new()),
            )
            .unwrap(),
        )
    };
    let ids = |p: &edgeprompt_edge::catalog::Published| {
        p.prompts.iter().map(|p| p.id.clone()).collect::<Vec<_>>()
    };

    // A fresh edge takes the fresh list, and refuses an expired or unstamped one.
    assert_eq!(ids(&edge().published().await.unwrap()), ["support"]);
    for (what, reply) in [("expired", &expired), ("without an issue time", &unstamped)] {
        *served.lock().unwrap() = reply.clone();
        let e = edge().published().await.unwrap_err();
        assert!(e.contains("issue") || e.contains("age"), "{what}: {e}");
    }

    // An edge that took the new list refuses the old one replayed (it would bring back a
    // prompt the cloud dropped), and keeps the new one.
    *served.lock().unwrap() = new;
    let p = edge();
    assert_eq!(ids(&p.published().await.unwrap()), ["support"]);
    *served.lock().unwrap() = old;
    tokio::time::sleep(edgeprompt_edge::catalog::LIST_TTL + Duration::from_millis(200)).await;
    // The stale list is asked again behind this call; give that asking time to land.
    let _ = p.published().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(ids(&p.published().await.unwrap()), ["support"]);
}
