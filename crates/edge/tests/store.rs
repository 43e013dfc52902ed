//! Edges reading published prompts from the cloud's object store (SeaweedFS's S3 gateway on
//! loopback, through a tap that records every byte), as from a CDN: the cloud streams nothing,
//! the KV is the cloud's bit for bit, the store hears of published prompts only, and whatever
//! the bucket holds, a forged or foreign object is refused and the cloud serves the prompt.

use std::sync::Arc;

use edgeprompt_cloud::CloudNode;
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::prefixes::{PrefixConfig, Prefixes, Source};
use edgeprompt_engine::PrefixKv;
use edgeprompt_kv::{content_address, BucketStore, Codec, Seal, SealKey};
use edgeprompt_testbed::{bucket, options, raw, weed};
use object_store::{ObjectStoreExt, PutPayload};

use crate::common::{self, edge_ids, model, prompt_specs, serve_cloud, Tap, SUPPORT};

const USER: &str = "Can I bring my bike on the train tomorrow?";

fn same(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

/// The edge's lookup with the cloud at `cloud` and the store read through `store` (a URL
/// standing for the S3 endpoint).
fn edge(cloud: &str, store: &str) -> Prefixes {
    let mut opts = options(0);
    for (k, v) in &mut opts {
        if k == "aws_endpoint" {
            *v = store.to_string();
        }
    }
    edge_on(
        cloud,
        BucketStore::open_with("s3://edgeprompt-kv/cdn", opts).unwrap(),
    )
}

fn edge_on(cloud: &str, kv_store: BucketStore) -> Prefixes {
    let cfg = PrefixConfig {
        kv_store: Some(Arc::new(kv_store)),
        ..common::prefix_config(cloud)
    };
    Prefixes::new(model(), cfg, Arc::new(Metrics::new())).unwrap()
}

#[test]
fn edges_take_published_prompts_from_the_store_and_nothing_else() {
    let w = weed();
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = Arc::new(
            CloudNode::new(m.clone(), &prompt_specs(), 256 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([6; 32]))
                .with_bucket(bucket(&w, "cdn")),
        );
        let exact = node.warm("support").await.unwrap();
        let cloud = Tap::start(&serve_cloud(node.clone()).await).await;
        let store = Tap::start(&format!("http://127.0.0.1:{}", w.s3)).await;
        let p = edge(&cloud.url, &store.url);
        let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
        let got = p.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Store);
        assert!(
            same(&got.prefix, &exact),
            "the store's KV differs from the cloud's"
        );
        // The cloud sent its list, not the KV.
        let from_cloud = cloud.down.lock().unwrap().len();
        assert!(
            from_cloud < exact.bytes() / 20,
            "{from_cloud} bytes came from the cloud for a {} byte prompt",
            exact.bytes()
        );
        // A private system message: computed here; neither the store nor the cloud hears of it.
        let (private_ids, _) = edge_ids(
            &m,
            "You are the private assistant of Ada Lovelace; her account number is 4411-2087.",
            USER,
        );
        let (to_store, to_cloud) = (store.bytes().len(), cloud.bytes().len());
        let private = p.for_system(&private_ids).await.unwrap();
        assert_eq!(private.source, Source::Local);
        assert_eq!(
            store.bytes().len(),
            to_store,
            "the store heard of a private prompt"
        );
        assert_eq!(
            cloud.bytes().len(),
            to_cloud,
            "the cloud heard of a private prompt"
        );
        let address = content_address(&m.fingerprint, &private_ids);
        for (who, bytes) in [("store", store.bytes()), ("cloud", cloud.bytes())] {
            let seen = String::from_utf8_lossy(&bytes).contains(&address);
            assert!(!seen, "the {who} saw the private prompt's address");
        }
    });
}

#[test]
fn forged_or_foreign_objects_are_refused_and_the_cloud_serves() {
    let w = weed();
    let m = model();
    let key = || SealKey::from_seed([7; 32]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = Arc::new(
            CloudNode::new(m.clone(), &prompt_specs(), 256 << 20)
                .unwrap()
                .with_signing(key()),
        );
        let exact = node.warm("support").await.unwrap();
        let other = node.warm("coding").await.unwrap();
        let cloud = serve_cloud(node.clone()).await;
        let address = content_address(&m.fingerprint, &exact.token_ids);
        let path = bucket(&w, "cdn").path(&m.fingerprint, &address);
        let stored = |p: &PrefixKv, id: &str, k: Option<SealKey>| {
            let mut b = Vec::new();
            let s = k.map(|k| Seal::sign(&k, id, p, Codec::F16, 0, false));
            edgeprompt_kv::write_prefix(&mut b, p, s.as_ref()).unwrap();
            b
        };
        let objects = [
            (
                "another prompt's signed KV",
                stored(&other, "coding", Some(key())),
            ),
            (
                "signed by another key",
                stored(&exact, "support", Some(SealKey::from_seed([1; 32]))),
            ),
            ("unsigned", stored(&exact, "support", None)),
            ("garbage", b"EPKV1\nnot a prefix".to_vec()),
        ];
        let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
        for (what, bytes) in objects {
            raw(w.s3).put(&path, PutPayload::from(bytes)).await.unwrap();
            let p = edge(&cloud, &format!("http://127.0.0.1:{}", w.s3));
            let got = p.for_system(&cloud_ids).await.unwrap();
            assert_eq!(got.source, Source::Cloud, "{what}");
            assert!(same(&got.prefix, &exact), "{what}: the KV differs");
        }
    });
}

/// The same objects over plain HTTP GETs (SeaweedFS's filer standing for a CDN in front of the
/// bucket): no credentials, the same checks, the same bits.
#[test]
fn edges_read_the_store_over_plain_http_as_from_a_cdn() {
    let w = weed();
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let node = Arc::new(
            CloudNode::new(m.clone(), &prompt_specs(), 256 << 20)
                .unwrap()
                .with_bucket(bucket(&w, "cdn")),
        );
        let exact = node.warm("support").await.unwrap();
        let cloud = serve_cloud(node.clone()).await;
        let cdn = format!("http://127.0.0.1:{}/buckets/edgeprompt-kv/cdn", w.filer);
        let p = edge_on(&cloud, BucketStore::open_with(&cdn, []).unwrap());
        let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
        let got = p.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Store);
        assert!(same(&got.prefix, &exact));
    });
}

/// An edge given no store reads the one the cloud's signed list names (its public face, here
/// SeaweedFS's filer standing for a CDN); told not to, it takes the prompt from the cloud.
#[test]
fn an_edge_reads_the_store_its_clouds_list_names() {
    let w = weed();
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cdn = format!("http://127.0.0.1:{}/buckets/edgeprompt-kv/listed", w.filer);
        let node = Arc::new(
            CloudNode::new(m.clone(), &prompt_specs(), 256 << 20)
                .unwrap()
                .with_bucket(bucket(&w, "listed"))
                .with_public_store(&cdn)
                .unwrap(),
        );
        let exact = node.warm("support").await.unwrap();
        let cloud = serve_cloud(node.clone()).await;
        let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
        let p = Prefixes::new(
            m.clone(),
            common::prefix_config(&cloud),
            Arc::new(Metrics::new()),
        )
        .unwrap();
        let got = p.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Store);
        assert!(same(&got.prefix, &exact));
        let cfg = PrefixConfig {
            listed_store: false,
            ..common::prefix_config(&cloud)
        };
        let p = Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap();
        let got = p.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Cloud);
        assert!(same(&got.prefix, &exact));
    });
    // A cloud names only an HTTP(S) store without credentials: every edge will fetch there.
    for bad in [
        "s3://edgeprompt-kv/listed",
        "file:///etc",
        "https://user:secret@cdn.example/kv",
    ] {
        let node = CloudNode::new(m.clone(), &prompt_specs(), 1 << 20).unwrap();
        assert!(node.with_public_store(bad).is_err(), "{bad}");
    }
}
