//! Every benchmark at toy scale on the real SmolLM2 model: it runs, writes JSON that parses with
//! the fields the report reads, writes its plots, and `bench report` renders all of it. No
//! timing is asserted (the machine is shared).

use std::path::{Path, PathBuf};

use edgeprompt_bench::workload::WorkloadSpec;
use edgeprompt_bench::{batch, chat, codecs, decode, engine, report, serve, table, ttft};
use edgeprompt_kv::Codec;

fn models() -> PathBuf {
    std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

fn file(name: &str) -> PathBuf {
    let p = models().join(name);
    assert!(
        p.exists(),
        "{} missing: run python3 scripts/models.py smollm2 sharegpt",
        p.display()
    );
    p
}

fn json(dir: &Path, name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn svg(dir: &Path, name: &str) {
    let s = std::fs::read_to_string(dir.join(name)).unwrap();
    assert!(
        s.starts_with("<svg") && s.contains("polyline"),
        "{name} is not a chart"
    );
}

#[test]
fn every_benchmark_runs_at_toy_scale_and_reports() {
    let model = file("SmolLM2-135M-Instruct.Q4_1.gguf");
    let sharegpt = file("ShareGPT_V3_unfiltered_cleaned_split.json");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();
    let spec = |groups, per_group, cloud_len, edge_len| WorkloadSpec {
        sharegpt: sharegpt.clone(),
        groups,
        per_group,
        cloud_len,
        edge_len,
        seed: 3,
    };

    let e = engine::run(&engine::Settings {
        model: model.clone(),
        threads: 2,
        prompt_lens: vec![16],
        decode_tokens: 2,
        repeats: 1,
        llama_python: None,
        skip_candle: false,
        decode_at: Some(20),
    })
    .unwrap();
    std::fs::write(
        out.join("engine-smollm2.json"),
        serde_json::to_string(&e).unwrap(),
    )
    .unwrap();
    let v = json(&out, "engine-smollm2.json");
    assert!(v["ours"]["decode"].as_f64().unwrap() > 0.0);
    // Decode timed after the context asked for, past the longest prompt.
    assert_eq!(v["decode_context"].as_u64(), Some(20));
    let rf = &v["roofline"];
    assert!(rf["stream_read_gbps"].as_f64().unwrap() > 0.0);
    assert!(rf["weight_bytes_per_token"].as_u64().unwrap() > 50_000_000);
    assert!(rf["decode_roofline_fraction"].as_f64().unwrap() > 0.0);
    if cfg!(feature = "candle") {
        assert!(v["candle"]["prefill"][0][1].as_f64().unwrap() > 0.0);
    } else {
        assert!(v["candle"].is_null(), "{}", v["candle"]);
    }

    ttft::run(&ttft::Settings {
        model: model.clone(),
        sharegpt: sharegpt.clone(),
        cloud_lens: vec![32],
        edge_len: 16,
        profiles: vec!["5g".into()],
        codec: Codec::F16,
        threads: 2,
        llama_python: None,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "ttft.json");
    let row = &v["rows"][0];
    assert!(row["pipelined_s"].as_f64().unwrap() > 0.0);
    assert!(row["predicted_pipelined_s"].as_f64().unwrap() > 0.0);
    svg(&out, "ttft-5g.svg");

    decode::run(&decode::Settings {
        model: model.clone(),
        sharegpt: Some(sharegpt.clone()),
        cloud_lens: vec![16, 32],
        batch_sizes: vec![1, 2],
        private_tokens: 4,
        steps: 1,
        repeats: 1,
        threads: 2,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "decode.json");
    assert_eq!(v["rows"].as_array().unwrap().len(), 8);
    svg(&out, "decode-batch.svg");

    batch::run(&batch::Settings {
        model: model.clone(),
        workload: spec(1, 2, 0, 8),
        cloud_lens: vec![24],
        max_tokens: 2,
        hardware: vec![("cloud".into(), 2), ("edge".into(), 1)],
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "batch.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6);
    assert!(rows
        .iter()
        .all(|r| r["generated_tokens"].as_u64().unwrap() > 0));
    svg(&out, "batch-edge.svg");

    serve::run(&serve::Settings {
        model: model.clone(),
        model_id: "smollm2".into(),
        workload: spec(1, 2, 24, 8),
        rates: vec![8.0],
        max_tokens: 3,
        threads: 2,
        max_batch: 8,
        llama_server: None,
        llama_server_args: None,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "serve.json");
    assert_eq!(v["fresh_prompts"].as_bool(), Some(true));
    let p = &v["points"][0];
    assert_eq!(p["failed"].as_u64(), Some(0));
    assert!(p["tok_s"].as_f64().unwrap() > 0.0);
    svg(&out, "serve-ttft.svg");

    // Two three-turn conversations: every turn answered, and turns 2 and 3 ran on the kept
    // KV of the turn before (the bench sends a cache_salt per conversation).
    chat::run(&chat::Settings {
        model: model.clone(),
        model_id: "smollm2".into(),
        sharegpt: sharegpt.clone(),
        conversations: 2,
        turns: 3,
        groups: 1,
        cloud_len: 24,
        turn_len: 12,
        max_tokens: 3,
        rates: vec![8.0],
        seed: 7,
        threads: 2,
        max_batch: 8,
        llama_server: None,
        llama_server_args: None,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "chat.json");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 3);
    for p in points {
        assert_eq!(
            (p["done"].as_u64(), p["failed"].as_u64()),
            (Some(2), Some(0))
        );
    }
    assert!(
        points[2]["cached_tokens"].as_f64().unwrap() > 0.0,
        "{points:?}"
    );

    table::run(&table::Settings {
        model: model.clone(),
        model_id: "smollm2".into(),
        workload: spec(2, 1, 24, 8),
        max_tokens: 3,
        profile: "5g".into(),
        codecs: vec![Codec::F16, Codec::Int8],
        threads: 2,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "table.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    // The split with f16 KV is exact: every answer equals the single-node one.
    let f16 = rows
        .iter()
        .find(|r| r["scheme"] == "cloud-edge f16")
        .unwrap();
    assert_eq!(f16["identical_answers"].as_f64(), Some(1.0));
    assert!(f16["link_down_mb"].as_f64().unwrap() > 0.0);
    let bars = std::fs::read_to_string(out.join("table-ttft.svg")).unwrap();
    assert_eq!(bars.matches("<rect").count(), 1 + rows.len());

    codecs::run(&codecs::Settings {
        models: vec![model.clone()],
        sharegpt: sharegpt.clone(),
        codecs: vec![Codec::F16, Codec::Int4Ch],
        pairs: 1,
        cloud_len: 40,
        edge_len: 8,
        answer_tokens: 4,
        threads: 2,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "codecs.json");
    let rows = v["rows"].as_array().unwrap();
    // f16 through the wire chunks and the reassembler is lossless: the answer is unchanged.
    assert_eq!(rows[0]["codec"], "f16");
    assert_eq!(rows[0]["ratio_vs_f16"].as_f64(), Some(1.0));
    assert_eq!(rows[0]["next_token_agreement"].as_f64(), Some(1.0));
    assert_eq!(rows[0]["identical_64"].as_f64(), Some(1.0));
    assert_eq!(rows[0]["max_abs_dlogit"].as_f64(), Some(0.0));
    assert!(rows[1]["ratio_vs_f16"].as_f64().unwrap() > 2.5);
    svg(&out, "codecs.svg");

    let md = report::run(&out, &out.join("results.md")).unwrap();
    for section in [
        "## KV codecs",
        "## Engine speed",
        "## TTFT over link profiles",
        "Planner validation",
        "## Batched decode",
        "## Throughput against cloud prompt length",
        "## Serving under Poisson load",
        "## Multi-turn chat",
        "## Cloud-only vs edge-only",
    ] {
        assert!(md.contains(section), "report lacks {section}");
    }
    svg(&out, "planner-validation.svg");
}

/// CE-LSLM at toy scale on the real 1.5B/0.5B pair: `align` writes the matching table and
/// adapters that load; `bench lslm` scores every configuration and measures TTFT over a shaped
/// link; `bench report` renders both and draws the heat maps. Slow (two real models).
#[test]
#[ignore = "slow: two real models (1.5B and 0.5B)"]
fn ce_lslm_align_and_bench_run_at_toy_scale_and_report() {
    use edgeprompt_align::job as align;
    use edgeprompt_align::Sampling;
    use edgeprompt_bench::lslm::{self, latency, quality};

    let llm = file("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf");
    let slm = file("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let sharegpt = file("ShareGPT_V3_unfiltered_cleaned_split.json");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();

    let a = align::run(&align::Settings {
        llm: llm.clone(),
        slm: slm.clone(),
        sharegpt: sharegpt.clone(),
        sequences: 3,
        seq_tokens: 128,
        sampling: Sampling {
            skip_first: 4,
            stride: 4,
        },
        t_cka: 0.0,
        t_rsa: -1.0,
        ridge: 1e-2,
        key_keeps: vec![1.0, 0.5],
        held_out: 0.2,
        threads: 2,
        out: out.clone(),
    })
    .unwrap();
    assert_eq!(a.matches.len(), 24);
    assert!(
        a.matches.iter().all(|m| m.is_some()),
        "zero thresholds match every layer"
    );
    let v = json(&out, "align.json");
    assert_eq!(v["similarity"]["cka"].as_array().unwrap().len(), 28);
    let files: Vec<PathBuf> = a.adapters.iter().map(|x| PathBuf::from(&x.path)).collect();
    assert_eq!(files.len(), 2);

    let r = lslm::run(&lslm::Settings {
        llm,
        slm,
        adapters: files,
        quality: Some(quality::Settings {
            sharegpt: sharegpt.clone(),
            cases: 1,
            cloud_tokens: 96,
            user_tokens: 32,
            answer_tokens: 24,
            first_record: 4000,
        }),
        latency: Some(latency::Settings {
            cloud_lens: vec![64],
            edge_len: 16,
            profiles: vec!["6g".into()],
            codec: Codec::F16,
        }),
        // 0: the planner may load every layer, whatever the toy quality run measured.
        min_agreement: 0.0,
        sharegpt,
        threads: 2,
        out: out.clone(),
    })
    .unwrap();
    assert_eq!(r.quality_split, Some(0));
    let q = r.quality.as_ref().unwrap();
    let find = |name: &str| q.configs.iter().find(|c| c.name == name).unwrap();
    // Each model alone agrees with itself on every token; perplexities are real numbers.
    assert_eq!(find("SLM alone").agree_slm, 1.0);
    assert_eq!(find("LLM alone").agree_llm, 1.0);
    assert!(q
        .configs
        .iter()
        .all(|c| c.perplexity.is_finite() && c.perplexity >= 1.0));
    // Every split of both adapter files and all 24 single layers were scored.
    assert!(q.configs.iter().any(|c| c.name.contains("ThinK 50%")));
    assert_eq!(
        q.configs
            .iter()
            .filter(|c| c.single_layer.is_some())
            .count(),
        24
    );
    let row = &r.latency[0];
    assert!(row.measured_s > 0.0 && row.slm_alone_s > 0.0 && row.llm_alone_s > 0.0);
    // From layer 0, all 24 mapped layers came down at the small model's size.
    assert_eq!(row.min_split, 0);
    assert!(row.min_split_bytes >= 24 * 512 * row.cloud_tokens);
    assert!(row.llm_kv_bytes_same_layers == 2 * 24 * 512 * row.cloud_tokens);
    assert_eq!(row.curve.len(), 25);
    for name in ["lslm-quality.svg", "lslm-ttft.svg"] {
        svg(&out, name);
    }

    let md = report::run(&out, &out.join("results.md")).unwrap();
    for section in [
        "## CE-LSLM layer matching",
        "## CE-LSLM quality",
        "## CE-LSLM TTFT and bytes",
    ] {
        assert!(md.contains(section), "report lacks {section}");
    }
    for name in ["align-cka.svg", "align-rsa.svg"] {
        let s = std::fs::read_to_string(out.join(name)).unwrap();
        // 28 x 24 cells, 24 matched pairs outlined, the colour bar's steps, background.
        assert!(s.matches("<rect").count() > 28 * 24 + 24 + 1, "{name}");
    }
}

#[test]
fn fresh_rounds_keep_the_cloud_prompts_and_never_repeat_a_private_one() {
    let model = edgeprompt_engine::Model::load(file("SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let spec = WorkloadSpec {
        sharegpt: file("ShareGPT_V3_unfiltered_cleaned_split.json"),
        groups: 3,
        per_group: 4,
        cloud_len: 24,
        edge_len: 16,
        seed: 5,
    };
    let w = edgeprompt_bench::workload::Workload::build(&model, &spec).unwrap();
    let rounds = w.fresh_rounds(&model, &spec, 4).unwrap();
    assert_eq!(rounds.len(), 4);
    let mut seen = std::collections::HashSet::new();
    for round in &rounds {
        let groups: Vec<usize> = round.iter().map(|r| r.cloud).collect();
        let want: Vec<usize> = w.requests.iter().map(|r| r.cloud).collect();
        assert_eq!(groups, want, "the same cloud prompts in the same order");
        for r in round {
            assert!(!r.user.is_empty());
            assert!(seen.insert(r.user.clone()), "repeated: {:?}", r.user);
        }
    }
    assert_eq!(seen.len(), 4 * 12);
}
