//! The edge keeps answering, with the same tokens, whatever happens to the cloud: a cloud that
//! is down, or whose connection dies at any point of the KV stream (cut over real sockets), or
//! that is gone after the stream; the KV then comes from a peer edge or this edge's disk. For a
//! hybrid model too, whose prompt is recurrent states beside KV.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use edgeprompt_edge::layer_stream::PromptKv;
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::peer::PeerService;
use edgeprompt_edge::prefixes::{
    rendezvous, PrefixConfig, Prefixes, Resolved, Source, UnknownSystem,
};
use edgeprompt_edge::scheduler::{Batcher, Event, Extras, Job, SchedulerConfig};
use edgeprompt_edge::CloudTrust;
use edgeprompt_engine::{Model, PrefixKv, SamplingParams};
use edgeprompt_kv::Codec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::TcpListenerStream;

use crate::common;
use common::{edge_ids, model, start_cloud, Switch, SUPPORT};

const USER: &str = "My train was cancelled an hour before departure. What do I get back?";

fn prefixes(
    m: &Arc<Model>,
    cloud: Option<String>,
    peers: Vec<String>,
    disk: Option<std::path::PathBuf>,
) -> Prefixes {
    // The cloud's key pinned on first contact, beside the disk tier when there is one (as
    // `edgeprompt serve --cache-dir` keeps it), so a restarted edge still checks its disk.
    let trust = CloudTrust::FirstUse(disk.as_ref().map(|d| d.join("known_clouds")));
    let cfg = PrefixConfig {
        trust,
        cloud_url: cloud,
        codec: Codec::F16,
        unknown_system: UnknownSystem::ComputeLocally,
        cache_bytes: 1 << 30,
        disk_dir: disk,
        peers,
        security: Default::default(),
        cloud_layers_from: 0,
        auto_codec: None,
        auto_split: None,
        ..Default::default()
    };
    Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap()
}

/// 16 greedy tokens of the private prompt after `prefix`, through the server's batcher.
fn answer(m: &Arc<Model>, prefix: Arc<PrefixKv>, prompt: &[u32]) -> Vec<u32> {
    answer_with(m, Some(prefix), Extras::default(), prompt)
}

/// `answer` for a prompt whole (`prefix`) or streaming (`extras.cold`); the batch is stepped
/// while the runtime's threads may still be bringing (or recomputing) the stream's layers.
fn answer_with(
    m: &Arc<Model>,
    prefix: Option<Arc<PrefixKv>>,
    extras: Extras,
    prompt: &[u32],
) -> Vec<u32> {
    let mut b = Batcher::new(
        m.clone(),
        SchedulerConfig::default(),
        Arc::new(Metrics::new()),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    let job = Job {
        prefix,
        prompt: prompt.to_vec(),
        max_tokens: 16,
        sampling: SamplingParams::default(),
        stop: Vec::new(),
        events: tx,
    };
    b.admit_with(job, extras).unwrap();
    while !b.is_idle() {
        if b.step() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    while let Ok(ev) = rx.try_recv() {
        match ev {
            Event::Done(d) => return d.token_ids,
            Event::Failed(e) => panic!("failed: {e}"),
            Event::Text(_) => {}
        }
    }
    panic!("no answer")
}

/// A TCP proxy to `upstream` that kills each connection once `cut_after` bytes have come
/// down (a cloud dying mid-stream, as the edge sees it). Counts the bytes it let through.
async fn cutting_proxy(upstream: SocketAddr, cut_after: u64, seen: Arc<AtomicU64>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = l.accept().await {
            let Ok(server) = TcpStream::connect(upstream).await else {
                continue;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                });
                let mut left = cut_after;
                let mut buf = vec![0u8; 16 << 10];
                while left > 0 {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n.min(left as usize),
                    };
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    left -= n as u64;
                    seen.fetch_add(n as u64, Ordering::Relaxed);
                }
                up.abort();
                // Dropping both halves closes both connections.
            });
        }
    });
    format!("http://{addr}")
}

/// The no-fault run, through a proxy that cuts nothing: the prompt as resolved, the answer on
/// it, and the stream's size in bytes.
async fn no_fault(
    m: &Arc<Model>,
    upstream: SocketAddr,
    cloud_ids: &[u32],
    prompt: &[u32],
) -> (Resolved, Vec<u32>, u64) {
    let seen = Arc::new(AtomicU64::new(0));
    let url = cutting_proxy(upstream, u64::MAX, seen.clone()).await;
    let reference = prefixes(m, Some(url), vec![], None)
        .for_system(cloud_ids)
        .await
        .unwrap();
    let want = answer(m, reference.prefix.clone(), prompt);
    (reference, want, seen.load(Ordering::Relaxed))
}

fn same_kv(a: &PrefixKv, b: &PrefixKv) -> bool {
    a.token_ids == b.token_ids && a.layers.iter().zip(&b.layers).all(|(x, y)| x == y)
}

/// For SmolLM2, and for a hybrid (Qwen3.5: recurrent states beside KV).
#[test]
fn cloud_faults_before_during_and_after_the_stream_never_change_the_answer() {
    for m in [model(), common::hybrid()] {
        cloud_faults_never_change_the_answer(m);
    }
}

fn cloud_faults_never_change_the_answer(m: Arc<Model>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USER);
    rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let upstream: SocketAddr = cloud.trim_start_matches("http://").parse().unwrap();
        let (reference, want, total) = no_fault(&m, upstream, &cloud_ids, &prompt).await;
        assert_eq!(reference.source, Source::Cloud);

        // Before: nothing listens where the cloud should be.
        let dead = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let mut points = vec![("cloud down".to_string(), format!("http://{dead}"))];
        // During: the connection dies after k/21 of the stream, k = 1..=20.
        for k in 1..=20u64 {
            let cut = total * k / 21;
            let url = cutting_proxy(upstream, cut, Arc::new(AtomicU64::new(0))).await;
            points.push((format!("cut after {cut} of {total} bytes"), url));
        }
        // After: the stream completed, then the connection is killed.
        let url = cutting_proxy(upstream, total, Arc::new(AtomicU64::new(0))).await;
        points.push(("cut right after the stream".to_string(), url));

        let mut local = 0;
        for (what, url) in points {
            let got = prefixes(&m, Some(url), vec![], None)
                .for_system(&cloud_ids)
                .await
                .unwrap();
            local += usize::from(got.source == Source::Local);
            assert!(
                same_kv(&got.prefix, &reference.prefix),
                "{what}: KV differs ({:?})",
                got.source
            );
            let tokens = answer(&m, got.prefix, &prompt);
            assert_eq!(tokens, want, "{what}: answer differs");
            eprintln!("{what}: answered from {:?}, same tokens", got.source);
        }
        assert!(
            local >= 15,
            "most cuts should force local compute ({local})"
        );
    });
}

/// Replicas of one cloud service: the replica a prompt asks first dies at any point of its
/// stream, and the next one (another cloud node signing with the same key) carries it on. The
/// prompt comes from the cloud every time (never computed here), bit for bit, so does the
/// answer.
#[test]
fn a_replica_dying_mid_stream_is_followed_by_the_next() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USER);
    let node = || {
        let n = edgeprompt_cloud::CloudNode::new(m.clone(), &common::prompt_specs(), 256 << 20)
            .unwrap()
            .with_signing(edgeprompt_kv::SealKey::from_seed([5; 32]));
        Arc::new(n)
    };
    rt.block_on(async {
        let (a, b) = (node(), node());
        let first = common::serve_cloud(a.clone()).await;
        let second = common::serve_cloud(b.clone()).await;
        let upstream: SocketAddr = first.trim_start_matches("http://").parse().unwrap();
        let (reference, want, total) = no_fault(&m, upstream, &cloud_ids, &prompt).await;
        let address =
            hex::decode(edgeprompt_kv::content_address(&m.fingerprint, &cloud_ids)).unwrap();
        for k in 1..=10u64 {
            let cut = total * k / 11;
            // A proxy to the first replica that every key of this prompt asks first.
            let dying = loop {
                let url = cutting_proxy(upstream, cut, Arc::new(AtomicU64::new(0))).await;
                let both = [url.clone(), second.clone()];
                if rendezvous(&both, &address)[0] == url {
                    break url;
                }
            };
            let cfg = PrefixConfig {
                cloud_url: Some(dying),
                cloud_replicas: vec![second.clone()],
                ..common::prefix_config("")
            };
            let p = Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap();
            let got = p.for_system(&cloud_ids).await.unwrap();
            let what = format!("cut after {cut} of {total} bytes");
            assert_eq!(got.source, Source::Cloud, "{what}");
            assert!(
                same_kv(&got.prefix, &reference.prefix),
                "{what}: KV differs"
            );
            assert_eq!(
                answer(&m, got.prefix, &prompt),
                want,
                "{what}: answer differs"
            );
        }
        // Both replicas served; neither computed the prompt more than once.
        assert!(a.prefills() <= 1 && b.prefills() <= 1);
        assert_eq!(b.prefills(), 1, "the second replica never streamed");
    });
}

/// A replica signing with another key than the deployment's (a stale or foreign one): its
/// list is refused and the next replica's is taken, its stream is refused and the next
/// replica streams; the edge never computes the prompt.
#[test]
fn a_replica_with_another_key_is_passed_over_for_the_next() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
    let node = |seed: u8| {
        let n = edgeprompt_cloud::CloudNode::new(m.clone(), &common::prompt_specs(), 256 << 20)
            .unwrap()
            .with_signing(edgeprompt_kv::SealKey::from_seed([seed; 32]));
        Arc::new(n)
    };
    rt.block_on(async {
        let (stray, good) = (node(6), node(5));
        let stray_url = common::serve_cloud(stray.clone()).await;
        let good_url = common::serve_cloud(good.clone()).await;
        let cfg = PrefixConfig {
            cloud_url: Some(stray_url),
            cloud_replicas: vec![good_url],
            trust: CloudTrust::Key(edgeprompt_kv::SealKey::from_seed([5; 32]).public()),
            ..common::prefix_config("")
        };
        let p = Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap();
        let got = p.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Cloud);
        // Taken only under the deployment's key (the edge's trust): the good replica's.
        let exact = good.warm("support").await.unwrap();
        assert!(same_kv(&got.prefix, &exact));
    });
}

/// An edge that has seen its cloud's list, whose cloud then goes down, gets a published
/// prompt from a peer (it asks peers only for what the cloud published).
#[test]
fn a_peer_edge_serves_the_prompt_when_the_cloud_is_down() {
    for m in [model(), common::hybrid()] {
        a_peer_serves(m);
    }
}

fn a_peer_serves(m: Arc<Model>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USER);
    rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let a = Arc::new(prefixes(&m, Some(cloud.clone()), vec![], None));
        let from_cloud = a.for_system(&cloud_ids).await.unwrap();
        assert_eq!(from_cloud.source, Source::Cloud);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(PeerService::server(a.clone(), Default::default()))
                .serve_with_incoming(TcpListenerStream::new(l)),
        );
        let link = Switch::start(&cloud).await;
        let b = prefixes(&m, Some(link.url.clone()), vec![peer], None);
        let listed = b.published().await.unwrap();
        assert_eq!(listed.prompts.len(), 2, "the cloud's list, while it was up");
        link.off();
        let got = b.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Peer);
        assert!(same_kv(&got.prefix, &from_cloud.prefix));
        assert_eq!(
            answer(&m, got.prefix, &prompt),
            answer(&m, from_cloud.prefix, &prompt)
        );
    });
}

#[test]
fn the_disk_tier_survives_a_restart_with_the_cloud_gone() {
    for m in [model(), common::hybrid()] {
        the_disk_tier_survives(m);
    }
}

fn the_disk_tier_survives(m: Arc<Model>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, _) = edge_ids(&m, SUPPORT, USER);
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let link = Switch::start(&cloud).await;
        let first = prefixes(&m, Some(link.url.clone()), vec![], Some(dir.path().into()));
        let fetched = first.for_system(&cloud_ids).await.unwrap();
        assert_eq!(fetched.source, Source::Cloud);
        // The disk copy is written in the background.
        for _ in 0..6000 {
            if std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "kv"))
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        drop(first);
        link.off();
        let restarted = prefixes(&m, Some(link.url.clone()), vec![], Some(dir.path().into()));
        let got = restarted.for_system(&cloud_ids).await.unwrap();
        assert_eq!(got.source, Source::Disk);
        assert!(same_kv(&got.prefix, &fetched.prefix));
    });
}

/// A request on a cold prompt follows the cloud's stream inside the batch; when the connection
/// dies mid-stream the rest of the prompt is computed here and the request goes on from the
/// layers it has: the same tokens as the no-fault answer, at every cut.
#[test]
fn a_streaming_cold_prompt_cut_mid_way_still_gives_the_same_answer() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (cloud_ids, prompt) = edge_ids(&m, SUPPORT, USER);
    let (upstream, want, total) = rt.block_on(async {
        let cloud = start_cloud(m.clone()).await;
        let upstream: SocketAddr = cloud.trim_start_matches("http://").parse().unwrap();
        let (_, want, total) = no_fault(&m, upstream, &cloud_ids, &prompt).await;
        (upstream, want, total)
    });
    let mut streamed = 0;
    for k in [1u64, 3, 5] {
        let cut = total * k / 6;
        // Held while the request runs, as the server's requests hold it.
        let lookup = rt.block_on(async {
            let url = cutting_proxy(upstream, cut, Arc::new(AtomicU64::new(0))).await;
            Arc::new(prefixes(&m, Some(url), vec![], None))
                .for_system_streaming(&cloud_ids)
                .await
                .unwrap()
        });
        let PromptKv::Streaming(stream) = lookup.kv.clone() else {
            // The cut came before the header: the prompt was computed here, whole.
            continue;
        };
        streamed += 1;
        let cold = Extras {
            cold: Some(stream),
            ..Extras::default()
        };
        let got = answer_with(&m, None, cold, &prompt);
        assert_eq!(got, want, "cut after {cut} of {total} bytes");
    }
    assert!(
        streamed >= 2,
        "the cuts past the header streamed ({streamed})"
    );
}
