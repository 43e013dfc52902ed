//! The CE-LSLM fuser over real loopback gRPC with the real models (cloud Qwen2.5-Coder-1.5B,
//! edge Qwen2.5-Coder-0.5B): the cloud computes the small model's own KV of its prompt and its
//! own, fuses them with a fuser file, signs and streams every layer; an edge server that asks
//! for fused KV answers with it. Checked against an in-process reference (both prefills and
//! the fuser applied by hand), bit for bit; layers whose gates are zero carry the small
//! model's own KV unchanged; the header and every layer's signature name the fuser. Slow (two
//! real models): run with `--include-ignored`.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_align::conversation::prefix_of;
use edgeprompt_align::fuser::write_for_test;
use edgeprompt_align::Fuser;
use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::trust::CloudTrust;
use edgeprompt_edge::{prefill_from_cloud, CloudClient};
use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{LayerKv, Model};
use edgeprompt_kv::{Codec, SealKey};
use edgeprompt_protocol::PromptRef;

use crate::common;
use crate::lslm::{chat_body, post, serve_slm, SYSTEM};

const USER: &str = "Which flag shows why my build step ran again?";

/// Layers the test fuser changes.
const GATED: [usize; 2] = [20, 23];

fn logits_after(m: &Model, layers: &[Arc<LayerKv>], cloud_len: usize, private: &[u32]) -> Vec<f32> {
    let mut pass = PrefillPass::new(m, private, cloud_len).unwrap();
    for l in layers {
        pass.run_layer(m, Some(l)).unwrap();
    }
    m.logits(&pass.hidden()[(private.len() - 1) * m.cfg.n_embd..])
        .unwrap()
}

#[test]
#[ignore = "slow: two real models (1.5B and 0.5B)"]
fn small_edge_model_answers_on_fused_kv_from_the_cloud() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global();
    let llm = common::load("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let slm = common::load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let ns = slm.cfg.n_layer;
    let dir = tempfile::tempdir().unwrap();
    let (gated_path, zero_path) = (
        dir.path().join("f.safetensors"),
        dir.path().join("z.safetensors"),
    );
    write_for_test(&gated_path, &llm, &slm, 16, &GATED, 0.5).unwrap();
    write_for_test(&zero_path, &llm, &slm, 16, &[], 0.0).unwrap();
    let fuser = Fuser::load(&gated_path).unwrap();
    let zero = Fuser::load(&zero_path).unwrap();
    assert_eq!(fuser.fused_layers(), GATED.to_vec());
    assert!(zero.fused_layers().is_empty());

    // A fuser trained for another pair is refused.
    let other = common::load("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(fuser.check(&llm, &other).is_err());
    assert!(fuser.check(&slm, &slm).is_err());

    // The reference, in one process.
    let (cloud_ids, private) = common::edge_ids(&slm, SYSTEM, USER);
    let llm_prefix = prefix_of(&llm, &cloud_ids).unwrap();
    let slm_prefix = prefix_of(&slm, &cloud_ids).unwrap();
    let fused: Vec<Arc<LayerKv>> = fuser
        .fuse(&llm, &slm, &llm_prefix.layers, &slm_prefix.layers)
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
    // Only the gated layers differ from the small model's own KV, bit for bit elsewhere; an
    // untrained (all-zero gates) fuser is the small model alone.
    for (j, (f, own)) in fused.iter().zip(&slm_prefix.layers).enumerate() {
        assert_eq!(**f == **own, !GATED.contains(&j), "layer {j}");
    }
    let untrained = zero
        .fuse(&llm, &slm, &llm_prefix.layers, &slm_prefix.layers)
        .unwrap();
    for (a, b) in untrained.iter().zip(&slm_prefix.layers) {
        assert_eq!(a, &**b);
    }
    let reference = logits_after(&slm, &fused, cloud_ids.len(), &private);
    assert_ne!(
        reference,
        logits_after(&slm, &slm_prefix.layers, cloud_ids.len(), &private),
        "the fused KV changes the answer's logits"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let specs = vec![PromptSpec {
            id: "tern".into(),
            system: SYSTEM.into(),
            text: None,
        }];
        let key = SealKey::from_seed([21; 32]);
        let trust = key.public();
        let node = |f: Fuser| {
            Arc::new(
                CloudNode::new(llm.clone(), &specs, 256 << 20)
                    .unwrap()
                    .with_signing(SealKey::from_seed([21; 32]))
                    .with_fuser(slm.clone(), f)
                    .unwrap(),
            )
        };
        // A mismatched fuser is refused when the cloud loads it.
        assert!(CloudNode::new(slm.clone(), &specs, 1 << 20)
            .unwrap()
            .with_fuser(slm.clone(), Fuser::load(&zero_path).unwrap())
            .is_err());
        let url = common::serve_cloud(node(Fuser::load(&gated_path).unwrap())).await;

        // Asked for fused KV: every layer, the header naming the fuser, each layer signed
        // over a statement that names it, the values the reference's.
        let mut client = CloudClient::connect(&url)
            .await
            .unwrap()
            .trusting(Some(trust))
            .accepting_fused(true);
        let (header, mut rx) = client
            .fetch(&slm, PromptRef::Id("tern".into()), &[Codec::F16], false)
            .await
            .unwrap();
        assert_eq!(header.fuser, fuser.sha256);
        assert_eq!((header.first_layer, header.mapped), (0, false));
        assert_eq!(header.manifest.fuser, fuser.sha256);
        let mut unfused = header.manifest.clone();
        unfused.fuser.clear();
        let mut got = Vec::new();
        while let Some(a) = rx.recv().await {
            let a = a.unwrap();
            let sig = a.seal.expect("every layer signed");
            trust
                .verify_layer(&header.manifest, a.layer, &a.kv, &sig)
                .unwrap();
            assert!(
                trust.verify_layer(&unfused, a.layer, &a.kv, &sig).is_err(),
                "a fused layer's signature does not pass for unfused KV"
            );
            assert_eq!(a.kv, *fused[a.layer], "layer {}", a.layer);
            // Exactly the small model's own KV's size: EdgePrompt mode's bytes.
            let per_layer = 512 * cloud_ids.len();
            assert!(a.wire_bytes >= per_layer && a.wire_bytes < per_layer + 4096);
            got.push(a.layer);
        }
        assert_eq!(got, (0..ns).collect::<Vec<_>>());

        // One shot over the network: the same logits as the reference.
        let mut client = CloudClient::connect(&url)
            .await
            .unwrap()
            .trusting(Some(trust))
            .accepting_fused(true);
        let (header, mut rx) = client
            .fetch(&slm, PromptRef::Id("tern".into()), &[Codec::F16], false)
            .await
            .unwrap();
        let (m, ids) = (slm.clone(), private.clone());
        let (mut seq, logits, _) = tokio::task::spawn_blocking(move || {
            prefill_from_cloud(&m, &header, &mut rx, &ids, Instant::now(), true).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(logits, reference, "network fused == in-process reference");
        let one_shot = common::greedy_text(&slm, &mut seq, logits, 24);

        // An edge that does not ask for fused KV is not sent it: this cloud runs another
        // model and maps nothing, so it is refused as before.
        let mut client = CloudClient::connect(&url).await.unwrap();
        let Err(e) = client
            .fetch(&slm, PromptRef::Id("tern".into()), &[Codec::F16], false)
            .await
        else {
            panic!("fused KV only where asked for")
        };
        assert!(e.to_string().contains("fingerprint"), "{e}");

        // Served: `serve --fused` answers the chat as the one-shot path did, its prefix from
        // the cloud, the whole small-model KV on the wire.
        let (addr, metrics) = serve_slm(
            &slm,
            PrefixConfig {
                unknown_system: UnknownSystem::Refuse,
                fused: true,
                trust: CloudTrust::Key(trust),
                ..common::prefix_config(&url)
            },
        )
        .await;
        let body = chat_body(USER);
        let answer = tokio::task::spawn_blocking(move || post(addr, &body))
            .await
            .unwrap();
        assert_eq!(answer, one_shot, "served fused == one-shot fused");
        let m = metrics.render();
        assert!(
            m.contains("edgeprompt_prefix_lookups_total{source=\"cloud\"} 1"),
            "{m}"
        );
        let bytes = ns * 512 * cloud_ids.len();
        let wire: f64 = m
            .lines()
            .find_map(|l| l.strip_prefix("edgeprompt_cloud_kv_bytes_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(
            wire >= bytes as f64 && wire < (bytes + 64 * 1024) as f64,
            "{wire} vs {bytes}"
        );

        // An untrained fuser serves the small model's own KV: the answer is the small model
        // alone's, which an edge computing the prompt itself gives.
        let url0 = common::serve_cloud(node(Fuser::load(&zero_path).unwrap())).await;
        let (addr, _) = serve_slm(
            &slm,
            PrefixConfig {
                unknown_system: UnknownSystem::Refuse,
                fused: true,
                trust: CloudTrust::Key(trust),
                ..common::prefix_config(&url0)
            },
        )
        .await;
        let (alone, _) = serve_slm(
            &slm,
            PrefixConfig {
                cloud_url: None,
                ..common::prefix_config(&url0)
            },
        )
        .await;
        let (b0, b1) = (chat_body(USER), chat_body(USER));
        let zero_answer = tokio::task::spawn_blocking(move || post(addr, &b0))
            .await
            .unwrap();
        let alone_answer = tokio::task::spawn_blocking(move || post(alone, &b1))
            .await
            .unwrap();
        assert_eq!(
            zero_answer, alone_answer,
            "zero gates == the small model alone"
        );
    });
}
