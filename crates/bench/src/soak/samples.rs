//! What the soak watches while it runs: each edge's bounded quantities once a second (from
//! its `/metrics`), and the clients' throughput and TTFT over time.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::client::{Outcome, Spec};
use super::{Ended, Limits};

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds after the load started.
    pub t: f64,
    pub edge: usize,
    pub kv_reserved_bytes: u64,
    pub prefix_cache_bytes: u64,
    /// Of those, the bytes requests hold (the cache evicts only the rest).
    pub prefix_cache_held_bytes: u64,
    pub private_cache_bytes: u64,
    pub queue_depth: u64,
    pub rss_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Bucket {
    /// Start of the bucket, seconds after the load started.
    pub t: f64,
    /// Requests answered whole in the bucket, per second.
    pub answered_per_s: f64,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p99_s: Option<f64>,
}

/// A gauge's value in a Prometheus text exposition.
pub(crate) fn gauge(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

pub(crate) async fn metrics(http: &reqwest::Client, url: &str) -> Option<String> {
    let r = http
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    r.text().await.ok()
}

/// Where an edge's cloud prompts came from over the run, and its failed disk writes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EdgeCounts {
    /// Source (`memory`, `disk`, `peer`, `cloud`, `local`) -> lookups.
    pub lookups: std::collections::BTreeMap<String, u64>,
    pub disk_write_errors: u64,
}

pub async fn edge_counts(http: &reqwest::Client, urls: &[String]) -> Vec<EdgeCounts> {
    let mut out = Vec::new();
    for u in urls {
        let m = metrics(http, u).await.unwrap_or_default();
        let mut c = EdgeCounts {
            disk_write_errors: gauge(&m, "edgeprompt_disk_cache_write_errors_total").unwrap_or(0),
            ..EdgeCounts::default()
        };
        for l in m.lines() {
            let Some(rest) = l.strip_prefix("edgeprompt_prefix_lookups_total{source=\"") else {
                continue;
            };
            if let Some((source, n)) = rest.split_once("\"} ") {
                c.lookups
                    .insert(source.into(), n.trim().parse::<f64>().unwrap_or(0.0) as u64);
            }
        }
        out.push(c);
    }
    out
}

/// Each edge's RSS now (0 if it does not answer).
pub async fn rss_now(http: &reqwest::Client, urls: &[String]) -> Vec<u64> {
    let mut out = Vec::new();
    for u in urls {
        let m = metrics(http, u).await.unwrap_or_default();
        out.push(gauge(&m, "edgeprompt_resident_memory_bytes").unwrap_or(0));
    }
    out
}

pub async fn sample_every_second(
    http: reqwest::Client,
    urls: Vec<String>,
    begin: Instant,
    span: Duration,
) -> Vec<Sample> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while begin.elapsed() < span {
        tick.tick().await;
        for (edge, u) in urls.iter().enumerate() {
            let Some(m) = metrics(&http, u).await else {
                continue;
            };
            let g = |n: &str| gauge(&m, n).unwrap_or(0);
            out.push(Sample {
                t: begin.elapsed().as_secs_f64(),
                edge,
                kv_reserved_bytes: g("edgeprompt_kv_reserved_bytes"),
                prefix_cache_bytes: g("edgeprompt_prefix_cache_bytes"),
                prefix_cache_held_bytes: g("edgeprompt_prefix_cache_held_bytes"),
                private_cache_bytes: g("edgeprompt_private_cache_bytes"),
                queue_depth: g("edgeprompt_queue_depth"),
                rss_bytes: g("edgeprompt_resident_memory_bytes"),
            });
        }
    }
    out
}

/// The bounds some sample broke, each with its worst sample. The prefix cache may exceed its
/// budget only by what requests hold (it evicts idle prompts only); the RSS bound is each
/// edge's RSS once ready plus every budget and a margin.
pub fn bounds_exceeded(samples: &[Sample], l: &Limits) -> Vec<String> {
    if samples.is_empty() {
        return vec!["no sample of the edges' bounds was taken".into()];
    }
    let mb = |b: u64| b as f64 / (1u64 << 20) as f64;
    type Check = (
        &'static str,
        fn(&Sample) -> u64,
        fn(&Sample, &Limits) -> u64,
    );
    let checks: [Check; 5] = [
        (
            "reserved private KV",
            |s| s.kv_reserved_bytes,
            |_, l| l.kv_budget_bytes,
        ),
        (
            "prefix cache (budget + held by requests)",
            |s| s.prefix_cache_bytes,
            |s, l| l.prefix_cache_bytes + s.prefix_cache_held_bytes,
        ),
        (
            "private cache",
            |s| s.private_cache_bytes,
            |_, l| l.private_cache_bytes,
        ),
        ("queue depth", |s| s.queue_depth, |_, l| l.max_queue),
        (
            "RSS",
            |s| s.rss_bytes,
            |s, l| l.rss_bytes.get(s.edge).copied().unwrap_or(0),
        ),
    ];
    let mut out = Vec::new();
    for (name, value, limit) in checks {
        let worst = samples
            .iter()
            .filter(|s| value(s) > limit(s, l))
            .max_by_key(|s| value(s) - limit(s, l));
        if let Some(s) = worst {
            let n = samples.iter().filter(|s| value(s) > limit(s, l)).count();
            let (v, lim) = (value(s), limit(s, l));
            out.push(if name == "queue depth" {
                format!(
                    "{name}: {v} > {lim} on edge {} at {:.0} s ({n} samples)",
                    s.edge, s.t
                )
            } else {
                format!(
                    "{name}: {:.1} MB > {:.1} MB on edge {} at {:.0} s ({n} samples)",
                    mb(v),
                    mb(lim),
                    s.edge,
                    s.t
                )
            });
        }
    }
    out
}

/// Each edge's largest sample of each bounded quantity, against its limit.
pub fn maxima(samples: &[Sample], l: &Limits) -> String {
    let mb = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut t = String::new();
    for (edge, rss) in l.rss_bytes.iter().enumerate() {
        let mine = || samples.iter().filter(move |s| s.edge == edge);
        let max = |f: fn(&Sample) -> u64| mine().map(f).max().unwrap_or(0);
        t += &format!(
            "edge {edge} maxima: reserved KV {:.1}/{:.0} MB, prefix cache {:.1} MB (held {:.1}, budget {:.0}), \
             private cache {:.1}/{:.0} MB, queue {}/{}, RSS {:.0}/{:.0} MB\n",
            mb(max(|s| s.kv_reserved_bytes)),
            mb(l.kv_budget_bytes),
            mb(max(|s| s.prefix_cache_bytes)),
            mb(max(|s| s.prefix_cache_held_bytes)),
            mb(l.prefix_cache_bytes),
            mb(max(|s| s.private_cache_bytes)),
            mb(l.private_cache_bytes),
            max(|s| s.queue_depth),
            l.max_queue,
            mb(max(|s| s.rss_bytes)),
            mb(*rss),
        );
    }
    t
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

/// Answers and TTFT in buckets of a thirtieth of the run (at least 2 s).
pub fn timeline(specs: &[Spec], ended: &[Ended], secs: f64) -> Vec<Bucket> {
    let width = (secs / 30.0).max(2.0);
    let n = (secs / width).ceil() as usize;
    (0..n)
        .map(|b| {
            let (lo, hi) = (b as f64 * width, (b + 1) as f64 * width);
            let mut ttfts: Vec<f64> = Vec::new();
            let mut answered = 0;
            for (spec, (start, end, o)) in specs.iter().zip(ended) {
                if let Some(Outcome::Answer { ttft_s, .. }) = o {
                    if *end >= lo && *end < hi {
                        answered += 1;
                    }
                    if *start >= lo && *start < hi && ttft_s.is_finite() && spec.stream {
                        ttfts.push(*ttft_s);
                    }
                }
            }
            ttfts.sort_by(f64::total_cmp);
            Bucket {
                t: lo,
                answered_per_s: answered as f64 / width,
                ttft_p50_s: quantile(&ttfts, 0.5),
                ttft_p99_s: quantile(&ttfts, 0.99),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(prefix: u64, held: u64, queue: u64) -> Sample {
        Sample {
            t: 3.0,
            edge: 1,
            kv_reserved_bytes: 0,
            prefix_cache_bytes: prefix,
            prefix_cache_held_bytes: held,
            private_cache_bytes: 0,
            queue_depth: queue,
            rss_bytes: 100,
        }
    }

    #[test]
    fn names_each_broken_bound_with_its_worst_sample() {
        let l = Limits {
            kv_budget_bytes: 1 << 20,
            prefix_cache_bytes: 16 << 20,
            private_cache_bytes: 1 << 20,
            max_queue: 4,
            rss_bytes: vec![1000, 1000],
        };
        // Over the budget by what requests hold: within the bound.
        let fine = [sample(40 << 20, 24 << 20, 4), sample(1 << 20, 0, 0)];
        assert_eq!(bounds_exceeded(&fine, &l), Vec::<String>::new());
        // Idle bytes over the budget, and a queue too deep.
        let bad = [sample(20 << 20, 0, 5), sample(30 << 20, 8 << 20, 2)];
        assert_eq!(
            bounds_exceeded(&bad, &l),
            [
                "prefix cache (budget + held by requests): 30.0 MB > 24.0 MB on edge 1 at 3 s (2 samples)",
                "queue depth: 5 > 4 on edge 1 at 3 s (1 samples)",
            ]
        );
        assert_eq!(bounds_exceeded(&[], &l).len(), 1);
    }

    #[test]
    fn reads_gauges_by_exact_name() {
        let text = "# HELP x\nedgeprompt_queue_depth 3\nedgeprompt_queue_depth_max 9\n\
                    edgeprompt_resident_memory_bytes 1.5e8\n";
        assert_eq!(gauge(text, "edgeprompt_queue_depth"), Some(3));
        assert_eq!(
            gauge(text, "edgeprompt_resident_memory_bytes"),
            Some(150_000_000)
        );
        assert_eq!(gauge(text, "edgeprompt_kv_reserved_bytes"), None);
    }
}
