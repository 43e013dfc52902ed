//! Cloud and edge over real loopback gRPC with the real SmolLM2 model: split over the network
//! equals split in one process, codecs trade bytes for agreement, bad requests get clear
//! errors and the cloud keeps serving.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_edge::{prefill_from_cloud, CloudClient};
use edgeprompt_engine::sample::argmax;
use edgeprompt_engine::{Model, Sequence};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::PromptRef;

use crate::common;
use common::{edge_ids, model, start_cloud, CODING, SUPPORT};

/// Greedy tokens; with `forced`, feed those tokens instead (teacher forcing) and return the
/// model's own argmax at each step.
fn greedy_forced(
    model: &Model,
    seq: &mut Sequence,
    mut logits: Vec<f32>,
    n: usize,
    forced: Option<&[u32]>,
) -> Vec<u32> {
    let mut out = Vec::new();
    for i in 0..n {
        let id = argmax(&logits);
        out.push(id);
        let next = forced.map_or(id, |f| f[i]);
        logits = seq.prefill(model, &[next]).unwrap();
    }
    out
}

fn greedy(model: &Model, seq: &mut Sequence, logits: Vec<f32>, n: usize) -> Vec<u32> {
    greedy_forced(model, seq, logits, n, None)
}

/// Fetch over gRPC and decode `n` greedy tokens; returns tokens and bytes down.
async fn over_network(
    url: &str,
    prompt: &str,
    user: &str,
    codec: Codec,
    pipeline: bool,
    n: usize,
) -> (Vec<u32>, usize) {
    over_network_forced(url, prompt, user, codec, pipeline, n, None).await
}

async fn over_network_forced(
    url: &str,
    prompt: &str,
    user: &str,
    codec: Codec,
    pipeline: bool,
    n: usize,
    forced: Option<Vec<u32>>,
) -> (Vec<u32>, usize) {
    let m = model();
    let mut client = CloudClient::connect(url).await.unwrap();
    let (header, mut rx) = client
        .fetch(&m, PromptRef::Id(prompt.into()), &[codec], false)
        .await
        .unwrap();
    let system = if prompt == "support" { SUPPORT } else { CODING };
    let (cloud_ids, ids) = edge_ids(&m, system, user);
    assert_eq!(
        header.token_ids, cloud_ids,
        "cloud and edge tokenise the cloud prompt alike"
    );
    tokio::task::spawn_blocking(move || {
        let (mut seq, logits, tl) =
            prefill_from_cloud(&m, &header, &mut rx, &ids, Instant::now(), pipeline).unwrap();
        let out = greedy_forced(&m, &mut seq, logits, n, forced.as_deref());
        (out, tl.bytes_down())
    })
    .await
    .unwrap()
}

fn in_process(system: &str, user: &str, n: usize) -> Vec<u32> {
    let m = model();
    let (cloud_ids, ids) = edge_ids(&m, system, user);
    let mut cloud = Sequence::new(&m);
    cloud.prefill(&m, &cloud_ids).unwrap();
    let prefix = Arc::new(cloud.export_prefix(&m).unwrap());
    let mut edge = Sequence::with_prefix(&m, prefix).unwrap();
    let logits = edge.prefill(&m, &ids).unwrap();
    greedy(&m, &mut edge, logits, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_over_grpc_equals_split_in_process() {
    let url = start_cloud(model()).await;
    let user = "I'm Dana, booking 7781-XK, my train leaves in 6 hours. Can I get my money back?";
    let want = in_process(SUPPORT, user, 32);
    // Cold (computed while streaming), then warm (from the cloud cache), pipelined or not.
    for pipeline in [true, true, false] {
        let (got, _) = over_network(&url, "support", user, Codec::F16, pipeline, 32).await;
        assert_eq!(got, want, "pipeline={pipeline}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantized_codecs_trade_bytes_for_agreement() {
    let url = start_cloud(model()).await;
    let user = "fn first(v: &Vec<i32>) -> i32 { v[0] } -- what is wrong here?";
    let n = 64;
    let (f16, f16_bytes) = over_network(&url, "coding", user, Codec::F16, true, n).await;
    // f16 carries the cloud's KV exactly: the single node's answer.
    assert_eq!(f16, in_process(CODING, user, n), "f16 over the network");
    // Floors under what the codecs measure here (int8 63/64, int4 62/64), with room for a
    // kernel change that moves a near-tie; a codec bug falls far below.
    for (codec, max_ratio, min_agree) in [(Codec::Int8, 0.55, 0.92), (Codec::Int4, 0.32, 0.85)] {
        let (got, bytes) = over_network(&url, "coding", user, codec, true, n).await;
        let run = got.iter().zip(&f16).take_while(|(a, b)| a == b).count();
        // Teacher-forced: both follow the f16 tokens; count positions whose argmax agrees.
        let (forced, _) =
            over_network_forced(&url, "coding", user, codec, true, n, Some(f16.clone())).await;
        let agree = forced.iter().zip(&f16).filter(|(a, b)| a == b).count();
        let ratio = bytes as f64 / f16_bytes as f64;
        eprintln!(
            "{}: {bytes} bytes ({:.1}% of f16's {f16_bytes}); next-token agreement with f16 {agree}/{n} (teacher-forced), free-running identical for the first {run} tokens",
            codec.name(),
            100.0 * ratio
        );
        assert!(
            ratio < max_ratio,
            "{} is not smaller: {ratio}",
            codec.name()
        );
        let rate = agree as f64 / n as f64;
        assert!(
            rate >= min_agree,
            "{}: next-token agreement {agree}/{n} is below {min_agree}",
            codec.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_the_cloud_keeps_serving() {
    let m = model();
    let url = start_cloud(m.clone()).await;
    let mut client = CloudClient::connect(&url).await.unwrap();
    let Err(err) = client
        .fetch(
            &m,
            PromptRef::Id("no-such-prompt".into()),
            &[Codec::F16],
            false,
        )
        .await
    else {
        panic!("unknown prompt is refused")
    };
    assert!(
        err.to_string().contains("NotFound") && err.to_string().contains("no-such-prompt"),
        "{err}"
    );
    let Err(err) = client
        .fetch(
            &m,
            PromptRef::ContentAddress(vec![7; 32]),
            &[Codec::F16],
            false,
        )
        .await
    else {
        panic!("unknown address is refused")
    };
    assert!(err.to_string().contains("NotFound"), "{err}");

    // An edge with a different model file (same shapes, other weights) is refused.
    let req = edgeprompt_protocol::FetchRequest {
        prompt: Some(PromptRef::Id("support".into())),
        model_fingerprint: "0".repeat(64),
        accept_codecs: vec!["f16".into()],
        accept_zstd: false,
        first_layer: 0,
        accept_fused: false,
    };
    let mut raw = edgeprompt_protocol::cloud_kv_client::CloudKvClient::connect(url.clone())
        .await
        .unwrap();
    let Err(status) = raw.fetch(req).await else {
        panic!("wrong model is refused")
    };
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(
        status.message().contains("fingerprint"),
        "{}",
        status.message()
    );

    // Still serving.
    let (got, _) = over_network(&url, "support", "Can I bring my dog?", Codec::F16, true, 8).await;
    assert_eq!(got, in_process(SUPPORT, "Can I bring my dog?", 8));
}

/// Privacy (docs/design.md §9): every byte the edge sent toward the cloud is captured; none of the
/// private prompt's text, token ids or KV is in it, and it is only the request itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_uploads_nothing_of_the_private_prompt() {
    let m = model();
    let url = start_cloud(m.clone()).await;
    let tap = common::Tap::start(&url).await;
    let (tapped, seen) = (tap.url.clone(), tap.up.clone());
    let user = "My name is Dana Whitfield, card 4929-1234-5678-9012, booking 7781-XK. Refund?";
    let (got, down) = over_network(&tapped, "support", user, Codec::F16, true, 16).await;
    assert_eq!(got, in_process(SUPPORT, user, 16));
    let up = seen.lock().unwrap().clone();
    let (_, ids) = edge_ids(&m, SUPPORT, user);
    let contains = |needle: &[u8]| up.windows(needle.len()).any(|w| w == needle);
    for secret in ["Dana", "Whitfield", "4929", "7781-XK", "Refund"] {
        assert!(!contains(secret.as_bytes()), "{secret:?} went to the cloud");
    }
    // Token ids in any plausible encoding: little-endian u32 runs and protobuf varint runs.
    for w in ids.windows(3) {
        let le: Vec<u8> = w.iter().flat_map(|i| i.to_le_bytes()).collect();
        assert!(!contains(&le), "edge token ids (u32) went to the cloud");
        let mut varint = Vec::new();
        for &id in w {
            let mut v = id;
            while v >= 0x80 {
                varint.push((v as u8) | 0x80);
                v >>= 7;
            }
            varint.push(v as u8);
        }
        assert!(
            !contains(&varint),
            "edge token ids (varint) went to the cloud"
        );
    }
    // KV of the edge prompt would be kilobytes per token; the upload is the request only
    // (HTTP/2 preface, settings, headers and one small FetchRequest).
    eprintln!("bytes up: {}, bytes down (KV payload): {down}", up.len());
    assert!(
        up.len() < 2048,
        "upload of {} bytes is more than a request",
        up.len()
    );
    assert!(
        contains(b"support"),
        "the capture does see the request (prompt id)"
    );
}

/// A proxy that flips one byte of what the cloud sends, after `offset` bytes.
async fn corrupting_proxy(upstream: String, offset: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = upstream.trim_start_matches("http://").to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&up).await.unwrap();
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let (mut buf, mut seen) = (vec![0u8; 1 << 16], 0usize);
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    if seen <= offset && offset < seen + n {
                        buf[offset - seen] ^= 0x20;
                    }
                    seen += n;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    format!("http://{addr}")
}

/// A byte flipped in transit inside the KV stream: the edge rejects the stream with an error
/// and uses nothing of it; the cloud goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_stream_is_rejected_and_the_cloud_keeps_serving() {
    let m = model();
    let url = start_cloud(m.clone()).await;
    let (_, ids) = edge_ids(&m, SUPPORT, "Hello");
    for offset in [20_000usize, 300_000, 900_000] {
        let bad = corrupting_proxy(url.clone(), offset).await;
        let mut client = CloudClient::connect(&bad).await.unwrap();
        let fetched = client
            .fetch(&m, PromptRef::Id("support".into()), &[Codec::F16], false)
            .await;
        let outcome = match fetched {
            Err(e) => Err(e.to_string()),
            Ok((header, mut rx)) => {
                let (m2, ids2) = (m.clone(), ids.clone());
                tokio::task::spawn_blocking(move || {
                    prefill_from_cloud(&m2, &header, &mut rx, &ids2, Instant::now(), true)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
                .await
                .unwrap()
            }
        };
        let err = outcome.expect_err("a corrupted stream must not be used");
        eprintln!("flip at byte {offset}: {err}");
        assert!(!err.is_empty());
    }
    let (got, _) = over_network(&url, "support", "Hello", Codec::F16, true, 8).await;
    assert_eq!(got, in_process(SUPPORT, "Hello", 8));
}

/// Many edges at once, two prompts, cold: every edge gets exactly its in-process answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_edges_at_once() {
    let url = start_cloud(model()).await;
    let asks = [
        ("support", "Can I bring my bike?"),
        ("coding", "Is `v[0]` safe on an empty Vec?"),
        ("support", "My train was 90 minutes late."),
        ("coding", "Should I unwrap here?"),
        ("support", "Can I change my seat?"),
        ("coding", "How do I avoid an index loop?"),
    ];
    let tasks: Vec<_> = asks
        .iter()
        .map(|&(p, u)| {
            let url = url.clone();
            tokio::spawn(async move { over_network(&url, p, u, Codec::F16, true, 12).await.0 })
        })
        .collect();
    for (t, (p, u)) in tasks.into_iter().zip(asks) {
        let got = t.await.unwrap();
        let system = if p == "support" { SUPPORT } else { CODING };
        assert_eq!(got, in_process(system, u, 12), "{p}: {u}");
    }
}
