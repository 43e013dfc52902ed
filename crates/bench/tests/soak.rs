//! The soak harness at CI size (SmolLM2, 60 s of load): real `redis-server`, cloud, link and
//! edge processes, one of each fault. Every request gets exactly one outcome, none broken or
//! hung, no panic in any log, every completed greedy answer equals the single-node answer,
//! the memory and queue bounds hold, and both edges drain to exit 0.

use std::path::PathBuf;

use edgeprompt_bench::soak::{self, chaos::Kind};

/// The product binary `cargo test --workspace` built beside this package's (the workspace's
/// own feature set: a `cargo build` from here would resolve features differently and rebuild).
fn edgeprompt() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_edgeprompt-bench")).with_file_name("edgeprompt");
    assert!(
        p.exists(),
        "{} missing: run the workspace's tests (scripts/test.sh), which build it",
        p.display()
    );
    p
}

fn models() -> PathBuf {
    std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

#[test]
#[ignore = "slow: processes and a 60 s load (scripts/test.sh runs it)"]
fn a_small_soak_accounts_for_every_request_through_every_fault() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let s = soak::Settings {
        model: models().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        edgeprompt: edgeprompt(),
        sharegpt: models().join("ShareGPT_V3_unfiltered_cleaned_split.json"),
        secs: 60.0,
        rate: 1.5,
        prompts: 8,
        cloud_len: 192,
        user_len: 32,
        max_tokens: 32,
        link: "wifi".into(),
        kv_budget_mb: 128,
        prefix_cache_mb: 16,
        private_cache_mb: 16,
        max_queue: 32,
        seed: 7,
        client_timeout_secs: 120,
        dir: dir.path().join("run"),
        out: out.path().to_path_buf(),
    };
    let r = soak::run(&s).unwrap();
    assert_eq!(r.violations(), Vec::<String>::new());

    // Not vacuous: the load ran, answers were checked, and each fault did what it says.
    let n = |k: &str| r.outcomes.get(k).copied().unwrap_or(0);
    assert!(r.sent > 60, "{}", r.sent);
    assert_eq!(r.outcomes.values().sum::<usize>(), r.sent);
    assert!(r.answers_compared > r.sent / 2, "{r:?}");
    assert!(n("cancelled") > 0, "some clients hang up: {:?}", r.outcomes);
    assert!(
        n("http_429") > 0,
        "the burst takes the KV budget: {:?}",
        r.outcomes
    );
    for k in Kind::ALL {
        assert!(
            r.faults.iter().any(|f| f.fault.kind == k),
            "{k:?} not applied"
        );
    }
    for f in &r.faults {
        if matches!(
            f.fault.kind,
            Kind::KillCloud | Kind::CutLink | Kind::StartRedis
        ) {
            assert!(f.recovery_s.is_some(), "no recovery after {f:?}");
        }
    }
    assert!(
        r.edges.iter().any(|e| e.disk_write_errors > 0),
        "{:?}",
        r.edges
    );
    let sources: Vec<&String> = r.edges.iter().flat_map(|e| e.lookups.keys()).collect();
    for s in ["memory", "disk", "peer", "cloud", "local"] {
        assert!(
            sources.iter().any(|x| *x == s),
            "no lookup from {s}: {:?}",
            r.edges
        );
    }
    assert!(out.path().join("soak.json").exists());
}
