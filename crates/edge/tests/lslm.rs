//! CE-LSLM over real loopback gRPC with the real models (cloud Qwen2.5-Coder-1.5B, edge
//! Qwen2.5-Coder-0.5B): adapters fitted on ShareGPT text, saved and loaded; the cloud serves
//! the edge model's deep layers mapped from its own KV; the edge computes the shallow layers
//! itself. The network result is checked against an independent single-process reference
//! (the LLM prefilled on its own, the adapters applied by hand), bit for bit, and the cloud's
//! refusals are checked. Slow (two real models): run with `--include-ignored`.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_align::{
    collect, compare, fit_adapters, match_layers, AdapterSet, FitOptions, Sampling,
};
use edgeprompt_cloud::{CloudNode, PromptSpec};
use edgeprompt_edge::http::access::ApiKeys;
use edgeprompt_edge::http::{serve, EdgeServer, ServerConfig};
use edgeprompt_edge::prefixes::{PrefixConfig, UnknownSystem};
use edgeprompt_edge::scheduler::SchedulerConfig;
use edgeprompt_edge::split_choice::{AutoSplit, CloudKv};
use edgeprompt_edge::{prefill_from_cloud, CloudClient};
use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{LayerKv, Message, Model, PrefixKv};
use edgeprompt_kv::Codec;
use edgeprompt_protocol::PromptRef;

use crate::common;

pub(crate) const SYSTEM: &str =
    "You are the release assistant of the Tern build system. Tern caches every \
build step by the hash of its inputs, runs steps in parallel up to the core count, and never \
uploads source code: only hashes leave the machine. Answer in two sentences and cite the \
relevant flag: --jobs sets parallelism, --offline disables the remote cache, --explain prints \
why a step re-ran, and --keep-going continues after a failed step.";

/// ShareGPT turn texts from the first records (what `edgeprompt align` calibrates on).
fn sharegpt_text(max_chars: usize) -> String {
    let bytes =
        std::fs::read(common::models_dir().join("ShareGPT_V3_unfiltered_cleaned_split.json"))
            .expect("ShareGPT missing: run python3 scripts/models.py sharegpt");
    let start = bytes.iter().position(|&b| b == b'[').unwrap() + 1;
    let mut text = String::new();
    let mut pos = start;
    while text.len() < max_chars {
        while matches!(bytes.get(pos), Some(b' ' | b'\n' | b',')) {
            pos += 1;
        }
        let mut it =
            serde_json::Deserializer::from_slice(&bytes[pos..]).into_iter::<serde_json::Value>();
        let rec = it.next().unwrap().unwrap();
        pos += it.byte_offset();
        for t in rec["conversations"].as_array().into_iter().flatten() {
            text.push_str(t["value"].as_str().unwrap_or_default());
            text.push('\n');
        }
    }
    text
}

fn system_ids(m: &Model, system: &str) -> Vec<u32> {
    let chat = m.chat.as_ref().unwrap();
    m.tokenizer
        .encode(
            &chat
                .render(&[Message::new("system", system)], false)
                .unwrap(),
        )
        .unwrap()
}

fn prefix_of(m: &Model, ids: &[u32]) -> PrefixKv {
    let mut pass = PrefillPass::new(m, ids, 0).unwrap();
    for _ in 0..m.cfg.n_layer {
        pass.run_layer(m, None).unwrap();
    }
    pass.into_prefix(m).unwrap()
}

#[test]
#[ignore = "slow: two real models (1.5B and 0.5B)"]
fn small_edge_model_reuses_the_large_cloud_models_mapped_kv() {
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build_global();
    let llm = common::load("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let slm = common::load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");

    // Calibrate on ShareGPT: 4 sequences of 300 tokens (1200 rows for 257 features).
    let text = sharegpt_text(40_000);
    let all = llm.tokenizer.encode(&text).unwrap();
    let seqs: Vec<Vec<u32>> = all.chunks(300).take(4).map(|c| c.to_vec()).collect();
    assert_eq!(seqs.len(), 4);
    let sampling = Sampling {
        skip_first: 4,
        stride: 6,
    };
    let llm_cal = collect(&llm, &seqs, sampling, |_, _| {}).unwrap();
    let slm_cal = collect(&slm, &seqs, sampling, |_, _| {}).unwrap();
    let sim = compare(&llm_cal, &slm_cal).unwrap();
    // The paper's observation (Fig. 5): similarity runs along the diagonal, so the deepest
    // SLM layer is closer to the LLM's deepest layer than to its first.
    let (nl, ns) = (llm.cfg.n_layer, slm.cfg.n_layer);
    assert!(sim.cka[nl - 1][ns - 1] > sim.cka[0][ns - 1]);
    assert!(sim.cka[0][0] > sim.cka[nl - 1][0]);
    let matches = match_layers(&sim.cka, &sim.rsa, 0.0, -1.0);
    assert!(matches.iter().all(|m| m.is_some()));
    let set = fit_adapters(
        &llm,
        &slm,
        &llm_cal,
        &slm_cal,
        &matches,
        &sim.cka,
        &sim.rsa,
        FitOptions {
            ridge: 1e-2,
            key_keep: 1.0,
            held_out: 0.25,
        },
        |_, _| {},
    )
    .unwrap();
    // The key maps explain held-out keys better than their mean does, on average.
    let r2: f64 = set.meta.pairs.iter().map(|p| p.r2_keys).sum::<f64>() / ns as f64;
    assert!(r2 > 0.0, "mean held-out R² of the key maps: {r2}");

    // Saved and loaded: the same maps.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adapters.safetensors");
    set.save(&path).unwrap();
    let set = AdapterSet::load(&path).unwrap();
    assert_eq!(set.meta.llm_fingerprint, llm.fingerprint);
    assert_eq!(set.meta.slm_fingerprint, slm.fingerprint);
    assert_eq!(set.min_split(), 0);

    // The reference, in one process: LLM prefill, adapters by hand, SLM shallow layers.
    let cloud_ids = system_ids(&llm, SYSTEM);
    assert_eq!(cloud_ids, system_ids(&slm, SYSTEM), "one tokenizer");
    let user = "Which flag shows why my build step ran again?";
    let split_prompt = slm
        .chat
        .as_ref()
        .unwrap()
        .split(SYSTEM, &[Message::new("user", user)])
        .unwrap();
    let private = slm.tokenizer.encode(&split_prompt.edge).unwrap();
    let llm_prefix = prefix_of(&llm, &cloud_ids);
    let slm_prefix = prefix_of(&slm, &cloud_ids);
    let split = 16;
    let layers: Vec<Arc<LayerKv>> = (0..ns)
        .map(|j| {
            if j < split {
                slm_prefix.layers[j].clone()
            } else {
                let i = set.llm_layer(j).unwrap();
                Arc::new(set.map_layer(&llm, j, &llm_prefix.layers[i]).unwrap())
            }
        })
        .collect();
    let mut pass = PrefillPass::new(&slm, &private, cloud_ids.len()).unwrap();
    for l in &layers {
        pass.run_layer(&slm, Some(l)).unwrap();
    }
    let reference = slm
        .logits(&pass.hidden()[(private.len() - 1) * slm.cfg.n_embd..])
        .unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let specs = vec![PromptSpec {
            id: "tern".into(),
            system: SYSTEM.into(),
            text: None,
        }];
        let node = Arc::new(
            CloudNode::new(llm.clone(), &specs, 256 << 20)
                .unwrap()
                .with_adapters(vec![set])
                .unwrap(),
        );
        let url = common::serve_cloud(node).await;

        // Over the network: layers 16.. from the cloud, 0..16 computed here.
        let mut client = CloudClient::connect(&url).await.unwrap();
        let (header, mut rx) = client
            .fetch_from(
                &slm,
                PromptRef::Id("tern".into()),
                &[Codec::F16],
                false,
                split,
            )
            .await
            .unwrap();
        assert_eq!(header.first_layer, split);
        assert_eq!(header.token_ids, cloud_ids);
        let (m, ids) = (slm.clone(), private.clone());
        let (mut seq, logits, timeline) = tokio::task::spawn_blocking(move || {
            prefill_from_cloud(&m, &header, &mut rx, &ids, Instant::now(), true).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(logits, reference, "network CE-LSLM == in-process reference");
        assert_eq!(seq.len(), cloud_ids.len() + private.len());
        let one_shot = common::greedy_text(&slm, &mut seq, logits, 24);
        // Only the loaded layers crossed the wire, at the small model's size (f16, 2 KV
        // heads x 64 dims x K and V = 512 bytes per token per layer).
        let loaded: Vec<_> = timeline
            .layers
            .iter()
            .filter(|l| l.wire_bytes > 0)
            .collect();
        assert_eq!(loaded.len(), ns - split);
        assert!(loaded.iter().all(|l| l.layer >= split));
        let per_layer = 512 * cloud_ids.len();
        for l in &loaded {
            assert!(l.wire_bytes >= per_layer && l.wire_bytes < per_layer + 4096);
        }

        // The large model's own edges are still served as before.
        let mut client = CloudClient::connect(&url).await.unwrap();
        let (h, _rx) = client
            .fetch(&llm, PromptRef::Id("tern".into()), &[Codec::F16], false)
            .await
            .unwrap();
        assert_eq!((h.first_layer, h.n_layers), (0, nl));

        // Refusals: a first layer past the model, and an edge model without adapters.
        let Err(e) = client
            .fetch_from(&slm, PromptRef::Id("tern".into()), &[Codec::F16], false, ns)
            .await
        else {
            panic!("first layer past the model is refused")
        };
        assert!(e.to_string().contains("InvalidArgument"), "{e}");
        let other = common::load("SmolLM2-135M-Instruct.Q4_1.gguf");
        let Err(e) = client
            .fetch_from(
                &other,
                PromptRef::Id("tern".into()),
                &[Codec::F16],
                false,
                4,
            )
            .await
        else {
            panic!("an edge model the cloud has no adapters for is refused")
        };
        assert!(e.to_string().contains("fingerprint"), "{e}");
        // And the cloud still serves after the refusals.
        let mut client = CloudClient::connect(&url).await.unwrap();
        let (_, mut rx) = client
            .fetch_from(&slm, PromptRef::Id("tern".into()), &[Codec::F16], false, 20)
            .await
            .unwrap();
        let mut got = 0;
        while let Some(a) = rx.recv().await {
            let a = a.unwrap();
            assert_eq!(a.layer, 20 + got);
            got += 1;
        }
        assert_eq!(got, ns - 20);

        // Served: an edge server on the small model with --cloud-layers-from 16 answers the
        // same chat exactly as the one-shot path above.
        let (addr, metrics) = serve_slm(
            &slm,
            PrefixConfig {
                unknown_system: UnknownSystem::Refuse,
                cloud_layers_from: split,
                ..common::prefix_config(&url)
            },
        )
        .await;
        let body = chat_body(user);
        let answer = tokio::task::spawn_blocking(move || post(addr, &body))
            .await
            .unwrap();
        assert_eq!(answer, one_shot, "served CE-LSLM == one-shot CE-LSLM");
        // Its prefix came from the cloud: only the mapped deep layers crossed the wire.
        let m = metrics.render();
        assert!(
            m.contains("edgeprompt_prefix_lookups_total{source=\"cloud\"} 1"),
            "{m}"
        );
        let bytes = (ns - split) * 512 * cloud_ids.len();
        let got: f64 = m
            .lines()
            .find_map(|l| l.strip_prefix("edgeprompt_cloud_kv_bytes_total "))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        assert!(
            got >= bytes as f64 && got < (bytes + 64 * 1024) as f64,
            "{got} vs {bytes}"
        );

        // --cloud-layers-from auto, with a quality table whose 0.9 floor is layer 16: nothing
        // measured yet, the first fetch loads every allowed layer, so the answer is split 16's.
        let table = dir.path().join("lslm.json");
        let row = |split: usize, agree: f64| {
            serde_json::json!({"split": split, "single_layer": null, "agree_slm": agree,
                               "adapters": "a.safetensors"})
        };
        let rows = [row(23, 0.98), row(20, 0.95), row(16, 0.92), row(12, 0.5)];
        let v = serde_json::json!({"slm": slm.cfg.name, "adapters": ["a.safetensors"],
                                   "quality": {"configs": rows}});
        std::fs::write(&table, v.to_string()).unwrap();
        let floor = AutoSplit::floor_from_table(&table, &slm.cfg.name, ns, 0.9).unwrap();
        assert_eq!(floor, split);
        let auto = Arc::new(AutoSplit::new(
            &slm,
            floor,
            AutoSplit::measure(&slm).unwrap(),
        ));
        let (addr, metrics) = serve_slm(
            &slm,
            PrefixConfig {
                auto_split: Some(auto.clone()),
                ..common::prefix_config(&url)
            },
        )
        .await;
        let b = chat_body(user);
        let auto_answer = tokio::task::spawn_blocking(move || post(addr, &b))
            .await
            .unwrap();
        assert_eq!(auto_answer, one_shot, "auto split == one-shot at the floor");
        let m = metrics.render();
        assert!(m.contains("edgeprompt_cloud_layers_from 16"), "{m}");
        // The fetch measured the loopback: loading stays the faster choice, at the floor.
        assert!(auto.link().is_some());
        assert_eq!(auto.choose(Some(cloud_ids.len())).split, split);
        // The header said the layers are mapped: the floor stays.
        assert_eq!(auto.cloud_kv(), CloudKv::Mapped);
    });
}

/// An edge server on the small model with `prefixes`, on an ephemeral port: its address and
/// metrics.
pub(crate) async fn serve_slm(
    slm: &Arc<Model>,
    prefixes: PrefixConfig,
) -> (std::net::SocketAddr, Arc<edgeprompt_edge::metrics::Metrics>) {
    let state = EdgeServer::start(
        slm.clone(),
        ServerConfig {
            model_id: "qwen05".into(),
            default_max_tokens: 24,
            api_keys: ApiKeys::default(),
        },
        SchedulerConfig::default(),
        prefixes,
    )
    .unwrap();
    let metrics = state.metrics.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, state));
    (addr, metrics)
}

/// The test's chat, greedy, 24 tokens.
pub(crate) fn chat_body(user: &str) -> String {
    serde_json::json!({
        "model": "qwen05",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 24,
        "temperature": 0,
    })
    .to_string()
}

/// POST a chat to the server at `addr`; the answer's content.
pub(crate) fn post(addr: std::net::SocketAddr, body: &str) -> String {
    let (_, v) = common::post_json(addr, "/v1/chat/completions", body);
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}
