//! A tiny fleet as real processes (SmolLM2: one cloud node and two edges behind shaped links,
//! and the cloud-only server), a few seconds of Poisson load each: every request sent has one
//! record, all answered, each with where its KV came from; the nodes' CPU time is counted, the
//! costs are fitted, and the simulator replays the same trace. No timing is asserted.

use std::path::PathBuf;

use edgeprompt_bench::fleet::{self, Setup};

fn models() -> PathBuf {
    std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

#[test]
#[ignore = "slow: processes, calibration and load (scripts/test.sh runs it)"]
fn a_tiny_fleet_accounts_for_every_request_and_replays_in_the_simulator() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_edgeprompt-bench"));
    let edgeprompt = bench.with_file_name("edgeprompt");
    assert!(
        edgeprompt.exists(),
        "{} missing: run the workspace's tests",
        edgeprompt.display()
    );
    let model = models().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let s = fleet::Settings {
        edgeprompt,
        bench,
        cloud_model: model.clone(),
        cloud_model_id: model.display().to_string(),
        edge_model: model.clone(),
        edge_model_id: model.display().to_string(),
        adapters: None,
        split: 0,
        sharegpt: models().join("ShareGPT_V3_unfiltered_cleaned_split.json"),
        prompts: 2,
        prefix_len: 96,
        private_len: 16,
        max_tokens: 8,
        link: "wifi".into(),
        setups: vec![Setup::EdgePrompt(2), Setup::CloudOnly],
        rates: vec![4.0],
        secs: 4.0,
        seed: 5,
        llama_server: None,
        llama_rates: Vec::new(),
        slots: 4,
        repeats: 1,
        dir: dir.path().join("run"),
        out: out.path().to_path_buf(),
    };
    let r = fleet::run(&s).unwrap();

    let nodes: Vec<&str> = r.calibration.iter().map(|c| c.node.as_str()).collect();
    assert_eq!(nodes, ["edge", "cloud", "cloud-only"]);
    // Timings: a loaded machine may fit no fixed cost at all and fit worse, so what is
    // checked is the fit's form (a step never costs less than nothing, every prompt token
    // costs something), not its accuracy, which the report prints.
    for c in &r.calibration {
        assert!(c.costs.fixed >= 0.0 && c.costs.per_token > 0.0, "{c:?}");
        assert!(c.fit_error.is_finite(), "{c:?}");
    }
    // The edges fetched each prompt's KV from the cloud while warming up.
    assert!(r.kv_bytes_per_token > 0.0);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.points.len(), 2);
    for p in &r.points {
        let m = &p.measured;
        // One record per request sent, every one answered, every answer accounted to a source.
        assert!(m.requests >= 4, "{} sent {}", p.setup, m.requests);
        assert_eq!(p.records.len(), m.requests);
        assert_eq!(
            m.failed,
            0,
            "{:?}",
            p.records
                .iter()
                .filter_map(|x| x.error.as_ref())
                .collect::<Vec<_>>()
        );
        assert_eq!(m.sources.values().sum::<usize>(), m.requests);
        for x in &p.records {
            assert!(
                x.tokens > 0 && x.private_tokens > 0 && x.cloud_tokens > 0,
                "{x:?}"
            );
            assert!(x.ttft_s.unwrap() <= x.latency_s.unwrap());
        }
        let sim = p
            .simulated
            .as_ref()
            .expect("the simulator replayed the trace");
        assert_eq!(sim.requests, m.requests);
        assert!(p.latency_error.unwrap().is_finite());
        // A warm cloud node may sit idle under EdgePrompt load; the serving nodes may not.
        let serving = p.nodes.iter().filter(|n| {
            n.node.starts_with("edge") || (p.setup == "cloud-only" && n.node == "cloud")
        });
        assert!(serving.clone().all(|n| n.cpu_secs > 0.0), "{:?}", p.nodes);
        // Every server's queue was sampled from its /metrics, and its requests add up.
        assert!(
            serving
                .clone()
                .all(|n| n.queue.as_ref().is_some_and(|q| q.samples > 0)),
            "{:?}",
            p.nodes
        );
        assert_eq!(serving.map(|n| n.requests).sum::<usize>(), m.requests);
    }
    let ep = &r.points[0];
    assert_eq!(ep.setup, "edgeprompt-2");
    // Warm edges answer from memory; both edges took load.
    assert_eq!(
        ep.measured.sources.get("memory"),
        Some(&ep.measured.requests)
    );
    for e in 0..2 {
        assert!(
            ep.records.iter().any(|x| x.edge == e),
            "edge {e} got no request"
        );
    }
    let names: Vec<&str> = ep.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(
        names,
        ["cloud", "link0", "edge0", "link1", "edge1", "client"]
    );
    assert!(
        ep.nodes[0].queue.is_none(),
        "the cloud node serves gRPC only"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("fleet.json")).unwrap())
            .unwrap();
    assert_eq!(v["points"].as_array().map(Vec::len), Some(2));
    // The report renders the run: its table, the simulator's error, the validation plot.
    let md = edgeprompt_bench::report::run(out.path(), &out.path().join("results.md")).unwrap();
    assert!(
        md.contains("A fleet under load, measured")
            && md.contains("| edgeprompt-2 | 4 |")
            && md.contains("| edgeprompt-2 | 4 | edge1 |"),
        "{md}"
    );
    let svg = std::fs::read_to_string(out.path().join("fleet-validation.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
}
