//! What a client or a peer can make an edge do is bounded: system prompts computed here at once
//! and in bytes, failed lookups that leave nothing behind, and a peer plane that speaks TLS,
//! wants its own token and relays only what the cloud signed.

use std::sync::Arc;

use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::metrics::Metrics;
use edgeprompt_edge::peer::{PeerPolicy, PeerService};
use edgeprompt_edge::prefixes::{LookupError, PrefixConfig, Prefixes, Source};
use edgeprompt_edge::{ClientSecurity, CloudTrust};
use edgeprompt_engine::Model;
use edgeprompt_kv::SealKey;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Identity, Server, ServerTlsConfig};

use crate::common;
use common::{edge_ids, model, pki, serve_cloud, CODING, SUPPORT};

fn prefixes(m: &Arc<Model>, cfg: PrefixConfig) -> Arc<Prefixes> {
    Arc::new(Prefixes::new(m.clone(), cfg, Arc::new(Metrics::new())).unwrap())
}

#[test]
fn local_prefills_are_bounded_in_number_and_bytes() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A long system prompt (about 2000 tokens) keeps the one slot busy for a while.
    let long = SUPPORT.repeat(30);
    let (long_ids, _) = edge_ids(&m, &long, "hi");
    let (short_ids, _) = edge_ids(&m, CODING, "hi");
    rt.block_on(async {
        let p = prefixes(
            &m,
            PrefixConfig {
                max_local_prefills: 1,
                ..Default::default()
            },
        );
        let busy = {
            let p = p.clone();
            let ids = long_ids.clone();
            tokio::spawn(async move { p.for_system(&ids).await.map(|r| r.source) })
        };
        // The long prefill holds the one slot (its bytes are reserved) before the next asks.
        while p.in_flight_bytes() == 0 {
            assert!(
                !busy.is_finished(),
                "the long prefill ended before it was seen"
            );
            tokio::task::yield_now().await;
        }
        match p.for_system(&short_ids).await {
            Err(LookupError::Busy(m)) => assert!(m.contains("retry later"), "{m}"),
            other => panic!("expected busy, got {:?}", other.map(|r| r.source)),
        }
        assert_eq!(busy.await.unwrap().unwrap(), Source::Local);
        // Once the slot is free the next one is served.
        assert_eq!(
            p.for_system(&short_ids).await.unwrap().source,
            Source::Local
        );

        // A prompt whose KV could never fit the prompt cache is refused up front.
        let small = prefixes(
            &m,
            PrefixConfig {
                cache_bytes: 1 << 20,
                ..Default::default()
            },
        );
        assert!(matches!(
            small.for_system(&long_ids).await,
            Err(LookupError::TooLong(_))
        ));
    });
}

#[test]
fn failed_lookups_leave_nothing_behind() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cloud = common::start_cloud(m.clone()).await;
        let p = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(cloud),
                ..Default::default()
            },
        );
        for i in 0..200 {
            let got = p.for_id(&format!("no-such-prompt-{i}")).await;
            assert!(matches!(got, Err(LookupError::UnknownId(_))));
        }
        assert_eq!(p.entries(), 0, "failed lookups are not kept");
        // A known one is kept.
        p.for_id("support").await.unwrap();
        assert_eq!(p.entries(), 1);
    });
}

#[test]
fn peers_over_tls_with_their_token_relay_only_signed_kv() {
    let m = model();
    let (ca, cert, key) = pki();
    let (ids, _) = edge_ids(&m, SUPPORT, "hi");
    let (coding_ids, _) = edge_ids(&m, CODING, "hi");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let signer = SealKey::from_seed([5; 32]);
        let trust = CloudTrust::Key(signer.public());
        let specs = vec![PromptSpec {
            id: "support".into(),
            system: SUPPORT.into(),
            text: None,
        }];
        let cloud = serve_cloud(Arc::new(
            CloudNode::new(m.clone(), &specs, 64 << 20)
                .unwrap()
                .with_signing(signer),
        ))
        .await;
        // Edge A: the signed prompt from the cloud, an unsigned one computed here.
        let a = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(cloud.clone()),
                trust: trust.clone(),
                ..Default::default()
            },
        );
        assert_eq!(a.for_system(&ids).await.unwrap().source, Source::Cloud);
        assert_eq!(
            a.for_system(&coding_ids).await.unwrap().source,
            Source::Local
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(
            Server::builder()
                .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(&cert, &key)))
                .unwrap()
                .add_service(PeerService::server(
                    a.clone(),
                    PeerPolicy {
                        token: Some("peer-secret".into()),
                        signed_only: true,
                        ..Default::default()
                    },
                ))
                .serve_with_incoming(TcpListenerStream::new(l)),
        );
        // Edge B asks A over TLS (peers come before the cloud, for what the cloud publishes).
        let b = |url: String, ca: Option<&str>| {
            prefixes(
                &m,
                PrefixConfig {
                    cloud_url: Some(cloud.clone()),
                    peers: vec![url],
                    peer_security: ClientSecurity {
                        ca_pem: ca.map(|c| c.as_bytes().to_vec()),
                        domain: Some("localhost".into()),
                        token: Some("peer-secret".into()),
                    },
                    trust: trust.clone(),
                    ..Default::default()
                },
            )
        };
        let https = format!("https://127.0.0.1:{port}");
        let got = b(https.clone(), Some(&ca)).for_system(&ids).await.unwrap();
        assert_eq!(
            got.source,
            Source::Peer,
            "relayed over TLS, signature checked"
        );
        // The private prompt A computed itself is asked of no one: B computes it too.
        let got = b(https, Some(&ca)).for_system(&coding_ids).await.unwrap();
        assert_eq!(got.source, Source::Local);
        // Plaintext to the TLS port does not get the token out (http:// to loopback is allowed
        // to try, and fails at the handshake): the cloud serves it.
        let got = b(format!("http://127.0.0.1:{port}"), None)
            .for_system(&ids)
            .await
            .unwrap();
        assert_eq!(got.source, Source::Cloud);
    });
}

/// A request that goes away does not free the slot of the prefill it started: the prompt's
/// computation holds its reservation until it ends (else closing connections in a loop would
/// run prefills without bound).
#[test]
fn a_cancelled_request_keeps_its_prefill_counted_until_the_prefill_ends() {
    let m = model();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // About 4000 tokens: seconds of prefill, against microseconds between the cancel and the
    // check below.
    let long = SUPPORT.repeat(60);
    let (long_ids, _) = edge_ids(&m, &long, "hi");
    let (short_ids, _) = edge_ids(&m, CODING, "hi");
    rt.block_on(async {
        let p = prefixes(
            &m,
            PrefixConfig {
                max_local_prefills: 1,
                ..Default::default()
            },
        );
        let started = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            p.for_system_streaming(&long_ids),
        )
        .await;
        assert!(
            started.is_err(),
            "the request went away before its prompt was computed"
        );
        assert!(p.in_flight_bytes() > 0, "the prefill still holds its bytes");
        match p.for_system(&short_ids).await {
            Err(LookupError::Busy(_)) => {}
            other => panic!("expected busy, got {:?}", other.map(|r| r.source)),
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while p.in_flight_bytes() > 0 {
            assert!(std::time::Instant::now() < until, "the prefill never ended");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(
            p.for_system(&short_ids).await.unwrap().source,
            Source::Local
        );
    });
}

/// An id a client names that the cloud does not list is asked of no one (the id is the
/// client's text), and an edge told which published prompts it serves asks for no others.
#[test]
fn unlisted_ids_and_prompts_outside_the_allow_list_are_asked_of_no_one() {
    let m = model();
    let (support_ids, _) = edge_ids(&m, SUPPORT, "hi");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let cloud = common::start_cloud(m.clone()).await;
        let tap = common::Tap::start(&cloud).await;
        let p = prefixes(
            &m,
            PrefixConfig {
                cloud_url: Some(tap.url.clone()),
                cloud_prompts: Some(vec!["coding".into()]),
                ..Default::default()
            },
        );
        let secret = "dana-whitfield-4417";
        assert!(matches!(
            p.for_id(secret).await,
            Err(LookupError::UnknownId(_))
        ));
        // "support" is published, but not one this edge takes: unknown by id, and its
        // system message computed here.
        assert!(matches!(
            p.for_id("support").await,
            Err(LookupError::UnknownId(_))
        ));
        assert_eq!(
            p.for_system(&support_ids).await.unwrap().source,
            Source::Local
        );
        // "coding" is fetched.
        assert_eq!(p.for_id("coding").await.unwrap().source, Source::Cloud);
        let up = tap.up.lock().unwrap().clone();
        let seen = |s: &str| up.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(seen("coding"), "the capture sees the fetch");
        assert!(!seen(secret) && !seen("support"), "nothing else was asked");
    });
}
