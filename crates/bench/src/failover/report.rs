//! The failover section of `docs/results.md`, from `<sub>failover.json`.

use std::fmt::Write;
use std::path::Path;

use crate::results::{f, load, machine_of};

/// Each fault's phase: the requests, the latency, the recovery and where prompts came from.
pub fn section(dir: &Path, sub: &str, md: &mut String) {
    let Some(v) = load(dir, &format!("{sub}failover.json")) else {
        return;
    };
    let outcomes = v["outcomes"].to_string();
    let _ = writeln!(
        md,
        "## Failover under load (`edgeprompt-bench failover`)\n\n{}; model {}; every part a \
         process on loopback: SeaweedFS (master, filer and S3 gateway; three volume servers, every \
         object on two), a six-node Redis Cluster, three cloud replicas sharing both (memory for 2 \
         of the {} prompts of {} tokens), two edges (caches for 2 prompts; edge 0 reads the store, \
         edge 1 only the replicas); {:.0} s of Poisson chats at {} req/s, {} output tokens; faults \
         at 1/4, 1/2, 3/4, none restarted. Sent {}, outcomes {}, answers equal to the single \
         node's {} of {}, panics {} (`{sub}failover.json`). *Back*: the broken part working again \
         (store: every object read whole, on the first probe after the kill: the second copies \
         served; Redis: replica promoted, cluster ok); *normal after*: the last request started \
         in the phase (and done before the next fault) slower than twice the warm healthy p99 \
         ended this long after the kill.\n\n\
         | from | fault | requests | failed | p50 s | p99 s | max s | back s | normal after s | edge 0 sources | edge 1 sources | replicas' tier reads | fetches moved off replica 0 |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        machine_of(&v["machine"]),
        v["model"].as_str().unwrap_or("?"),
        v["prompts"],
        v["prompt_tokens"],
        f(&v["secs"]),
        v["rate"],
        v["max_tokens"].as_u64().map_or("?".into(), |x| x.to_string()),
        v["sent"],
        outcomes,
        v["answers_identical"],
        v["answers_compared"],
        v["panics"].as_array().map_or(0, Vec::len),
    );
    let map = |m: &serde_json::Value| {
        m.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    for p in v["phases"].as_array().into_iter().flatten() {
        let back = p["component_recovery_s"]
            .as_f64()
            .map_or("-".into(), |x| format!("{x:.2}"));
        let _ = writeln!(
            md,
            "| {:.0} s | {} | {} | {} | {:.2} | {:.2} | {:.2} | {back} | {:.2} | {} | {} | {} | {} |",
            f(&p["at_s"]),
            p["fault"].as_str().unwrap_or("?").replace('_', " "),
            p["requests"],
            p["failed"],
            f(&p["p50_s"]),
            f(&p["p99_s"]),
            f(&p["max_s"]),
            f(&p["served_normally_after_s"]),
            map(&p["edge_sources"][0]),
            map(&p["edge_sources"][1]),
            map(&p["replica_tier_reads"]),
            p["fetches_moved_off_replica0"],
        );
    }
    md.push('\n');
}
