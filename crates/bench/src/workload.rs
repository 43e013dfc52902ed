//! Seeded, reproducible workloads from ShareGPT text (EdgePrompt §3.2): cloud prompts of a
//! given token length shared by groups of requests, each with its own private prompt.

use std::path::PathBuf;

use edgeprompt_engine::Model;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::BenchError;

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadSpec {
    pub sharegpt: PathBuf,
    /// Distinct cloud prompts (groups).
    pub groups: usize,
    pub per_group: usize,
    pub cloud_len: usize,
    pub edge_len: usize,
    pub seed: u64,
}

pub struct Request {
    /// Index into `Workload::cloud`.
    pub cloud: usize,
    pub user: String,
}

pub struct Workload {
    pub cloud: Vec<String>,
    /// In arrival order (groups interleaved by the seed).
    pub requests: Vec<Request>,
}

impl Workload {
    pub fn build(model: &Model, spec: &WorkloadSpec) -> Result<Self, BenchError> {
        let turns = crate::sharegpt::turns(&spec.sharegpt, 3000)?;
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let mut text = |n: usize| -> Result<String, BenchError> {
            let start = rng.random_range(0..turns.len());
            let mut s = String::new();
            for t in turns.iter().cycle().skip(start).take(turns.len()) {
                s.push_str(t);
                s.push('\n');
                if s.len() > 6 * n {
                    break;
                }
            }
            Ok(cut(model, &s, n)?)
        };
        let cloud = (0..spec.groups)
            .map(|_| text(spec.cloud_len))
            .collect::<Result<Vec<_>, _>>()?;
        let mut requests = Vec::with_capacity(spec.groups * spec.per_group);
        for g in 0..spec.groups {
            for _ in 0..spec.per_group {
                requests.push(Request {
                    cloud: g,
                    user: text(spec.edge_len)?,
                });
            }
        }
        requests.shuffle(&mut rng);
        Ok(Self { cloud, requests })
    }

    /// `rounds` sets of this workload's requests (same cloud prompts, groups and order), each
    /// request with a private prompt of its own: no two, in any round, start at the same
    /// ShareGPT turn, so a server's prompt cache can hold nothing of a request before it comes
    /// but the cloud prompt.
    pub fn fresh_rounds(
        &self,
        model: &Model,
        spec: &WorkloadSpec,
        rounds: usize,
    ) -> Result<Vec<Vec<Request>>, BenchError> {
        let turns = crate::sharegpt::turns(&spec.sharegpt, 3000)?;
        let need = rounds * self.requests.len();
        if need > turns.len() {
            return Err(BenchError::Data(format!(
                "{need} fresh private prompts asked of {} ShareGPT turns",
                turns.len()
            )));
        }
        let mut starts: Vec<usize> = (0..turns.len()).collect();
        starts.shuffle(&mut StdRng::seed_from_u64(spec.seed ^ 0xf7e5));
        let mut starts = starts.into_iter();
        (0..rounds)
            .map(|_| {
                self.requests
                    .iter()
                    .map(|r| {
                        let start = starts.next().unwrap_or_default();
                        let mut s = String::new();
                        for t in turns.iter().cycle().skip(start).take(turns.len()) {
                            s.push_str(t);
                            s.push('\n');
                            if s.len() > 6 * spec.edge_len {
                                break;
                            }
                        }
                        Ok(Request {
                            cloud: r.cloud,
                            user: cut(model, &s, spec.edge_len)?,
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

pub use edgeprompt_align::job::cut;

/// About `n` tokens of ShareGPT text: turns from a seeded start, cut to `n` tokens.
pub fn text(
    model: &Model,
    turns: &[String],
    rng: &mut StdRng,
    n: usize,
) -> Result<String, BenchError> {
    let start = rng.random_range(0..turns.len().max(1));
    let mut t = String::new();
    for turn in turns.iter().cycle().skip(start).take(turns.len()) {
        t += turn;
        t.push('\n');
        if t.len() > 6 * n {
            break;
        }
    }
    Ok(cut(model, &t, n)?)
}
