//! Cloud replicas on a real Redis Cluster: six `redis-server`s on loopback (three masters, one
//! replica each), made a cluster by `redis-cli --cluster create`. A prompt is prefilled once
//! across racing replicas (the lease), served by the others from the cluster, and still served
//! from it after the master holding its slot is killed and its replica promoted.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_engine::{Model, PrefixKv};
use edgeprompt_kv::{content_address, RedisStore, SealKey};
use edgeprompt_testbed::redis::{cluster, cluster_ok, conn, holders, info, wait_for};

fn model() -> Arc<Model> {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    Arc::new(Model::load(dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap())
}

fn same(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

#[test]
fn replicas_share_prompts_through_a_cluster_that_loses_a_master() {
    let mut cluster = cluster();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail. Refunds are full up to 24 hours \
                 before departure."
            .into(),
        text: None,
    }];
    let urls = cluster.urls();
    let node = || {
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([3; 32]))
                .with_shared(Arc::new(RedisStore::open_cluster(&urls, "fleet").unwrap())),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let exact = rt.block_on(async {
        // Three replicas asked for the same cold prompt at once: one prefills (the lease),
        // the others wait for its copy.
        let racers: Vec<_> = (0..3).map(|_| node()).collect();
        let got = futures_util::future::join_all(racers.iter().map(|n| n.warm("support"))).await;
        let got: Vec<_> = got.into_iter().map(|k| k.unwrap()).collect();
        let prefills: usize = racers.iter().map(|n| n.prefills()).sum();
        assert_eq!(prefills, 1, "the prompt was prefilled {prefills} times");
        assert!(got.iter().all(|k| same(k, &got[0])));
        got[0].clone()
    });
    // The master holding the prompt goes; its replica (in sync with it) takes over.
    let address = content_address(&m.fingerprint, &exact.token_ids);
    let key = RedisStore::open_cluster(&urls, "fleet")
        .unwrap()
        .key(&address);
    let ports: Vec<u16> = cluster.servers.iter().map(|s| s.port).collect();
    let (master, replica) = holders(&ports, &key);
    wait_for("the value on the replica", Duration::from_secs(30), || {
        let mut c = conn(replica);
        let _: () = redis::cmd("READONLY").query(&mut c).unwrap();
        redis::cmd("EXISTS")
            .arg(&key)
            .query::<bool>(&mut c)
            .unwrap()
    });
    cluster.kill(master);
    let t0 = Instant::now();
    wait_for("the replica promoted", Duration::from_secs(60), || {
        info(replica, "replication").contains("role:master") && cluster_ok(replica)
    });
    println!(
        "failover: replica of {master} serving after {:?}",
        t0.elapsed()
    );
    // Every surviving node knows of the promotion (a client may ask any of them for slots).
    let survivors: Vec<u16> = cluster
        .servers
        .iter()
        .map(|s| s.port)
        .filter(|&p| p != master)
        .collect();
    wait_for(
        "the promotion known to every node",
        Duration::from_secs(60),
        || {
            survivors.iter().all(|&p| {
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query(&mut conn(p))
                    .unwrap_or_default();
                nodes
                    .lines()
                    .any(|l| l.contains(&format!(":{replica}@")) && l.contains("master"))
                    && cluster_ok(p)
            })
        },
    );
    println!("failover: every node agrees after {:?}", t0.elapsed());
    // A replica started now reads the prompt from the promoted node.
    let late = node();
    let got = rt.block_on(late.warm("support")).unwrap();
    assert_eq!(late.prefills(), 0, "the prompt was lost with its master");
    assert!(same(&got, &exact));
}

/// The same cluster speaking TLS to its clients and between its nodes: racing replicas given
/// the deployment's CA prefill the prompt once and share it bit for bit.
#[test]
fn replicas_share_prompts_through_a_tls_cluster() {
    let cluster = edgeprompt_testbed::redis::tls_cluster();
    let m = model();
    let specs = [PromptSpec {
        id: "support".into(),
        system: "You are the support assistant of Acme Rail.".into(),
        text: None,
    }];
    let urls = cluster.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")));
    let ca = cluster.tls.as_ref().map(|(_, ca)| ca.as_slice());
    let node = || {
        Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(SealKey::from_seed([3; 32]))
                .with_shared(Arc::new(
                    RedisStore::open_cluster_with(&urls, "tls", ca).unwrap(),
                )),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let racers: Vec<_> = (0..3).map(|_| node()).collect();
        let got = futures_util::future::join_all(racers.iter().map(|n| n.warm("support"))).await;
        let got: Vec<_> = got.into_iter().map(|k| k.unwrap()).collect();
        let prefills: usize = racers.iter().map(|n| n.prefills()).sum();
        let hits: usize = racers.iter().map(|n| n.shared_hits()).sum();
        assert_eq!((prefills, hits), (1, 2), "prefills and shared hits");
        assert!(got.iter().all(|k| same(k, &got[0])));
    });
}
