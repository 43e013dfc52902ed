//! Failover under load at CI size (SmolLM2, 40 s of load): three cloud replicas, SeaweedFS with
//! three volume servers and a six-node Redis Cluster as real processes; a volume server, the
//! Redis master holding most prompts and a replica killed in turn. Every request answered,
//! every answer the single node's, and each fault shown to have hit a path in use.

use std::path::PathBuf;

use edgeprompt_bench::failover::{self, Fault};

/// The product binary `cargo test --workspace` built beside this package's.
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
#[ignore = "slow: a dozen processes and 40 s of load (scripts/test.sh runs it)"]
fn no_request_fails_while_a_volume_server_a_redis_master_and_a_replica_die() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let s = failover::Settings {
        model: models().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        edgeprompt: edgeprompt(),
        sharegpt: models().join("ShareGPT_V3_unfiltered_cleaned_split.json"),
        secs: 40.0,
        rate: 2.0,
        prompts: 8,
        cloud_len: 256,
        user_len: 24,
        max_tokens: 12,
        seed: 11,
        client_timeout_secs: 120,
        dir: dir.path().join("run"),
        out: out.path().to_path_buf(),
    };
    let r = failover::run(&s).unwrap();
    assert_eq!(r.violations(), Vec::<String>::new());
    assert!(r.sent > 40 && r.answers_compared == r.sent, "{r:?}");
    let phase = |f: Fault| r.phases.iter().find(|p| p.fault == f).unwrap();
    let from = |p: &failover::Phase, edge: usize, source: &str| {
        p.edge_sources[edge].get(source).copied().unwrap_or(0)
    };
    // Not vacuous: each fault hit a path the load was using.
    let v = phase(Fault::KillVolumeServer);
    assert!(v.component_recovery_s.is_some(), "{v:?}");
    assert!(from(v, 0, "store") > 0, "the store edge read it: {v:?}");
    let m = phase(Fault::KillRedisMaster);
    assert!(m.component_recovery_s.is_some(), "no promotion: {m:?}");
    assert_eq!(m.every_prompt_served, Some(true), "{m:?}");
    assert!(m.replica_tier_reads.values().sum::<usize>() > 0, "{m:?}");
    let c = phase(Fault::KillCloudReplica);
    assert!(from(c, 1, "cloud") > 0, "{c:?}");
    assert!(
        c.fetches_moved_off_replica0 > 0,
        "no fetch met the dead replica: {c:?}"
    );
}
