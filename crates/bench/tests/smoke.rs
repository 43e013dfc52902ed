//! Every benchmark at toy scale on the real SmolLM2 model: it runs, writes JSON that parses with
//! the fields the report reads, writes its plots, and `bench report` renders all of it. No
//! timing is asserted (the machine is shared).

use std::path::{Path, PathBuf};

use edgeprompt_bench::workload::WorkloadSpec;
use edgeprompt_bench::{batch, decode, engine, report, serve, table, ttft};
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
    })
    .unwrap();
    std::fs::write(
        out.join("engine-smollm2.json"),
        serde_json::to_string(&e).unwrap(),
    )
    .unwrap();
    let v = json(&out, "engine-smollm2.json");
    assert!(v["ours"]["decode"].as_f64().unwrap() > 0.0);
    assert!(v["candle"]["prefill"][0][1].as_f64().unwrap() > 0.0);

    ttft::run(&ttft::Settings {
        model: model.clone(),
        sharegpt: sharegpt.clone(),
        cloud_lens: vec![32],
        edge_len: 16,
        profiles: vec!["5g".into()],
        codec: Codec::F16,
        threads: 2,
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
        llama_server: None,
        out: out.clone(),
    })
    .unwrap();
    let v = json(&out, "serve.json");
    let p = &v["points"][0];
    assert_eq!(p["failed"].as_u64(), Some(0));
    assert!(p["tok_s"].as_f64().unwrap() > 0.0);
    svg(&out, "serve-ttft.svg");

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

    let md = report::run(&out, &out.join("results.md")).unwrap();
    for section in [
        "## Engine speed",
        "## TTFT over link profiles",
        "Planner validation",
        "## Batched decode",
        "## Throughput against cloud prompt length",
        "## Serving under Poisson load",
        "## Cloud-only vs edge-only",
    ] {
        assert!(md.contains(section), "report lacks {section}");
    }
    svg(&out, "planner-validation.svg");
}
