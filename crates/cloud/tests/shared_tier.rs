//! Two cloud nodes on one real Redis (a `redis-server` started for the test on loopback): a
//! prompt prefilled by one is served by the other without prefilling it again, bit for bit
//! (a hybrid model's recurrent states too).

use std::path::PathBuf;
use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_engine::Model;
use edgeprompt_kv::{RedisStore, SealKey};

/// A throwaway redis-server on a free loopback port (CI installs it from Debian's packages).
fn redis() -> (edgeprompt_testbed::redis::Server, String) {
    edgeprompt_testbed::redis::single()
}

fn load(file: &str) -> Arc<Model> {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    Arc::new(Model::load(dir.join(file)).unwrap())
}

fn model() -> Arc<Model> {
    load("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// For SmolLM2, and for hybrids (Qwen3.5, LFM2), whose prompts hold recurrent states beside KV.
#[test]
fn a_prompt_prefilled_by_one_cloud_node_is_served_by_another() {
    for m in [model(), load("synth/qwen35.gguf"), load("synth/lfm2.gguf")] {
        served_by_another(m);
    }
}

fn served_by_another(m: Arc<Model>) {
    let (_redis, url) = redis();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail. Refunds are full up to 24 hours \
                 before departure."
            .into(),
        text: None,
    }];
    // The nodes of one deployment sign with its key (each node's own fresh key otherwise,
    // and a node takes from the tier only what its key signed).
    let node = |ns: &str| {
        let store = Arc::new(RedisStore::open(&url, ns).unwrap());
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([2; 32]))
                .with_shared(store),
        )
    };
    let (a, b, other) = (node("edgeprompt"), node("edgeprompt"), node("elsewhere"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let from_a = a.warm("support").await.unwrap();
        assert_eq!(a.prefills(), 1);
        let from_b = b.warm("support").await.unwrap();
        assert_eq!(
            b.prefills(),
            0,
            "node b prefilled a prompt node a had stored"
        );
        assert_eq!(from_a.token_ids, from_b.token_ids);
        assert!(from_a
            .layers
            .iter()
            .zip(&from_b.layers)
            .all(|(x, y)| x == y));
        // Another namespace shares nothing.
        other.warm("support").await.unwrap();
        assert_eq!(other.prefills(), 1);
    });
}

/// The same over TLS (`rediss://`): node B reads what node A stored, each checking the
/// server's certificate against the deployment's CA; a node trusting only the system's roots
/// reaches nothing (no certificate of that Redis is taken unchecked) and computes the prompt.
#[test]
fn nodes_share_prompts_through_redis_over_tls() {
    let tls = edgeprompt_testbed::redis::single_tls();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail.".into(),
        text: None,
    }];
    let node = |ca: Option<&[u8]>| {
        let store = Arc::new(RedisStore::open_with(&tls.url, "tls", ca).unwrap());
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([2; 32]))
                .with_shared(store),
        )
    };
    let ca = Some(tls.ca_pem.as_slice());
    let (a, b, untrusting) = (node(ca), node(ca), node(None));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let from_a = a.warm("support").await.unwrap();
        let from_b = b.warm("support").await.unwrap();
        assert_eq!((a.prefills(), b.prefills(), b.shared_hits()), (1, 0, 1));
        assert!(from_a
            .layers
            .iter()
            .zip(&from_b.layers)
            .all(|(x, y)| x == y));
        let alone = untrusting.warm("support").await.unwrap();
        assert_eq!((untrusting.prefills(), untrusting.shared_hits()), (1, 0));
        assert_eq!(alone.token_ids, from_a.token_ids);
    });
}

/// A shared tier anyone on the path (or another tenant of the Redis) may write: a signing
/// cloud takes from it only what its deployment's key signed for that very prompt, and
/// computes the rest itself. Whatever is stored, the node answers with the exact KV.
#[test]
fn hostile_redis_values_are_refused_and_recomputed() {
    use edgeprompt_kv::{Codec, Seal, SealKey};
    let (_redis, url) = redis();
    let m = model();
    let spec = |id: &str, system: &str| PromptSpec {
        id: id.into(),
        system: system.into(),
        text: None,
    };
    let specs = [
        spec("support", "You are the support assistant of Acme Rail."),
        spec("other", "You are a terse Rust reviewer."),
    ];
    let key = || SealKey::from_seed([9; 32]);
    let node = |ns: &str| {
        let store = Arc::new(RedisStore::open(&url, ns).unwrap());
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_shared(store)
                .with_signing(key()),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // The genuine KV of both prompts, each from a node of its own namespace.
        let exact = node("genuine").warm("support").await.unwrap();
        let other = node("genuine").warm("other").await.unwrap();
        let address = edgeprompt_kv::content_address(&m.fingerprint, &exact.token_ids);
        let store = RedisStore::open(&url, "hostile").unwrap();
        let mut tampered = (*exact).clone();
        let mut l = (*tampered.layers[3]).clone();
        l.truncate(l.len() - 1);
        tampered.layers[3] = Arc::new(l);
        let seal = |p: &edgeprompt_engine::PrefixKv, id: &str, k: &SealKey| {
            Seal::sign(k, id, p, Codec::F16, 0, false)
        };
        let raw = |bytes: Vec<u8>| {
            let c = redis::Client::open(url.as_str()).unwrap();
            let mut conn = c.get_connection().unwrap();
            redis::cmd("SET")
                .arg(store.key(&address))
                .arg(bytes)
                .exec(&mut conn)
                .unwrap();
        };
        type Put<'a> = Box<dyn Fn() + 'a>;
        let values: Vec<(&str, Put)> = vec![
            ("garbage", Box::new(|| raw(b"EPKV1\nnot a prefix".to_vec()))),
            (
                "a header length of 2^62",
                Box::new(|| {
                    let mut b = b"EPKV1\n".to_vec();
                    b.extend((1u64 << 62).to_le_bytes());
                    raw(b)
                }),
            ),
            (
                "unsigned",
                Box::new(|| store.put(&address, &exact, None).unwrap()),
            ),
            (
                "tampered under a stale seal",
                Box::new(|| {
                    store
                        .put(&address, &tampered, Some(&seal(&exact, "support", &key())))
                        .unwrap()
                }),
            ),
            (
                "another prompt's signed KV",
                Box::new(|| {
                    store
                        .put(&address, &other, Some(&seal(&other, "other", &key())))
                        .unwrap()
                }),
            ),
            (
                "forged lower layers under a seal from layer 8 on",
                Box::new(|| {
                    let s = Seal::sign(&key(), "support", &tampered, Codec::F16, 8, false);
                    store.put(&address, &tampered, Some(&s)).unwrap()
                }),
            ),
            (
                "signed by another key",
                Box::new(|| {
                    let k = SealKey::from_seed([1; 32]);
                    store
                        .put(&address, &exact, Some(&seal(&exact, "support", &k)))
                        .unwrap()
                }),
            ),
        ];
        for (what, put) in &values {
            put();
            let n = node("hostile");
            let got = n.warm("support").await.unwrap();
            assert_eq!(n.prefills(), 1, "{what}: not taken from Redis");
            assert_eq!(got.token_ids, exact.token_ids, "{what}");
            assert!(
                got.layers.iter().zip(&exact.layers).all(|(a, b)| a == b),
                "{what}"
            );
            // The node stored the genuine signed copy back: the next node takes it.
            let next = node("hostile");
            next.warm("support").await.unwrap();
            assert_eq!(next.prefills(), 0, "{what}: the good copy was stored");
        }
    });
}

/// A node took a prompt's lease and died before storing it: the next node waits for the lease
/// to run out, then computes the prompt itself (once), exactly, and gives its own lease back.
#[test]
fn a_lease_whose_holder_died_runs_out_and_the_prompt_is_computed() {
    let (_redis, url) = redis();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail.".into(),
        text: None,
    }];
    let exact_node = Arc::new(CloudNode::new(m.clone(), &specs, 64 << 20).unwrap());
    let store = RedisStore::open(&url, "edgeprompt").unwrap();
    let node = Arc::new(
        CloudNode::new(m.clone(), &specs, 64 << 20)
            .unwrap()
            .with_shared(Arc::new(RedisStore::open(&url, "edgeprompt").unwrap())),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let exact = exact_node.warm("support").await.unwrap();
        let address = edgeprompt_kv::content_address(&m.fingerprint, &exact.token_ids);
        let lease = store.lease_key(&address);
        let mut conn = redis::Client::open(url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("SET")
            .arg(&lease)
            .arg("a-node-that-died")
            .arg("PX")
            .arg(1500)
            .exec(&mut conn)
            .unwrap();
        let got = node.warm("support").await.unwrap();
        assert_eq!(node.prefills(), 1);
        assert!(got.layers.iter().zip(&exact.layers).all(|(a, b)| a == b));
        let left: bool = redis::cmd("EXISTS").arg(&lease).query(&mut conn).unwrap();
        assert!(!left, "the node kept its lease after storing the prompt");
    });
}
