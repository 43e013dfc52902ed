//! A fleet on the simulator's clock: one cloud node, edges on their own links, requests on
//! shared cloud prompts; served the EdgePrompt way (the cloud prefills each prompt once, edges
//! fetch its KV once and answer everything else themselves) or cloud-only (the cloud model
//! answers every request on its own cores).

use std::collections::HashMap;

use serde::Serialize;

use super::server::{Batcher, Fifo, Job, StepCost};
use super::Clock;

/// One model's costs on one node, fitted to measurements: prefill of `n` tokens takes
/// `prefill_fixed + n prefill_per_token + n² prefill_per_token2` seconds; a decode step of `b`
/// sequences attending to `c` tokens each takes `step_fixed + b step_per_seq + b c
/// step_per_ctx` seconds, plus the prefill of whatever prompt tokens share the step.
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Costs {
    pub prefill_fixed: f64,
    pub prefill_per_token: f64,
    pub prefill_per_token2: f64,
    pub step_fixed: f64,
    pub step_per_seq: f64,
    pub step_per_ctx: f64,
}

impl Costs {
    pub fn prefill_secs(&self, n: usize) -> f64 {
        let n = n as f64;
        self.prefill_fixed + n * self.prefill_per_token + n * n * self.prefill_per_token2
    }
}

impl StepCost for Costs {
    fn step_secs(&self, decoding: usize, context: f64, prefill: usize) -> f64 {
        let b = decoding as f64;
        let decode = if decoding > 0 {
            self.step_fixed + b * self.step_per_seq + b * context * self.step_per_ctx
        } else {
            0.0
        };
        let p = prefill as f64;
        let prefill = if prefill > 0 {
            p * self.prefill_per_token + p * p * self.prefill_per_token2
        } else {
            0.0
        };
        (decode + prefill).max(self.step_fixed)
    }
}

#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize)]
pub struct Link {
    pub bytes_per_sec: f64,
    pub rtt_secs: f64,
}

impl Link {
    fn transfer(&self, bytes: usize) -> f64 {
        self.rtt_secs + bytes as f64 / self.bytes_per_sec
    }
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Fleet {
    pub edges: usize,
    /// The edge model on an edge node.
    pub edge: Costs,
    /// The cloud model on the cloud node (its prefill of cloud prompts; cloud-only: all).
    pub cloud: Costs,
    /// Cloud prompts prefilled at once.
    pub cloud_prefill_slots: usize,
    /// Cloud-only: sequences the cloud decodes together, and prompt tokens a step takes.
    pub cloud_batch: usize,
    pub chunk: usize,
    pub edge_batch: usize,
    /// Wire bytes of one cloud-prompt token's KV (the edge model's, in the chosen codec).
    pub kv_bytes_per_token: usize,
    /// Each edge's link to the cloud; clients reach edges on their own network.
    pub link: Link,
    /// Clients' link to the cloud (cloud-only).
    pub client_link: Link,
    /// Token counts of the cloud prompts.
    pub prompts: Vec<usize>,
}

/// One request: when, at which edge, on which cloud prompt, its own tokens in and out.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Request {
    pub at: f64,
    pub edge: usize,
    pub prompt: usize,
    pub private: usize,
    pub output: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Kv {
    /// The edge held the prompt's KV.
    Memory,
    /// The edge fetched it; the cloud held it.
    Cloud,
    /// The edge fetched it and the cloud prefilled it first.
    Prefilled,
    /// Cloud-only serving.
    CloudOnly,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Outcome {
    pub ttft: f64,
    pub latency: f64,
    pub output: usize,
    pub kv: Kv,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    EdgePrompt,
    CloudOnly,
}

enum Ev {
    Arrive(usize),
    /// Cloud prompt `p` prefilled on the cloud.
    Prefilled(usize),
    /// Cloud prompt `p`'s KV landed on edge `e`.
    Landed(usize, usize),
    /// Node `n` (edges 0.., the cloud last) starts a step if it is idle.
    Kick(usize),
    /// A batching step of node `n` ended: the requests it gave a first token, and finished.
    StepEnd(usize, Vec<usize>, Vec<usize>),
}

/// Simulate `requests` (sorted by time) and return one outcome per request, in order.
pub fn simulate(f: &Fleet, mode: Mode, requests: &[Request]) -> Vec<Outcome> {
    let mut clock: Clock<Ev> = Clock::default();
    for (i, r) in requests.iter().enumerate() {
        clock.schedule(r.at, Ev::Arrive(i));
    }
    let cloud_node = f.edges;
    let mut nodes: Vec<Batcher<usize>> = (0..f.edges)
        .map(|_| Batcher::new(f.edge_batch, f.chunk))
        .chain(std::iter::once(Batcher::new(f.cloud_batch, f.chunk)))
        .collect();
    let costs = |n: usize| if n == cloud_node { &f.cloud } else { &f.edge };
    let mut prefill: Fifo<usize> = Fifo::new(f.cloud_prefill_slots);
    let mut cloud_has = vec![false; f.prompts.len()];
    // Cloud-only: the request whose prefill puts each prompt in the cloud's cache.
    let mut caching: Vec<Option<usize>> = vec![None; f.prompts.len()];
    // Fetches in flight: (edge, prompt) -> where it comes from and the requests waiting on it.
    let mut fetching: HashMap<(usize, usize), (Kv, Vec<usize>)> = HashMap::new();
    // Prompts the cloud is prefilling -> edges waiting on them.
    let mut prefilling: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut edge_has = vec![vec![false; f.prompts.len()]; f.edges];
    let mut first: Vec<Option<f64>> = vec![None; requests.len()];
    let mut out: Vec<Option<Outcome>> = vec![None; requests.len()];
    let mut kv = vec![Kv::Memory; requests.len()];

    // On an edge the prefix is the fetched KV; on a cloud-only node its prompt cache.
    let job = |i: usize| {
        let r = &requests[i];
        Job {
            tag: i,
            prompt: r.private,
            output: r.output,
            prefix: f.prompts[r.prompt],
        }
    };
    // An idle node starts its step once everything arriving at this instant is in, as the
    // edge's scheduler admits every queued request at a step's start.
    let submit = |clock: &mut Clock<Ev>, nodes: &mut Vec<Batcher<usize>>, n: usize, j| {
        if nodes[n].arrive(j) {
            clock.schedule(0.0, Ev::Kick(n));
        }
    };
    let fetch = |clock: &mut Clock<Ev>, e: usize, p: usize| {
        clock.schedule(
            f.link.transfer(f.prompts[p] * f.kv_bytes_per_token),
            Ev::Landed(e, p),
        );
    };

    while let Some(ev) = clock.advance() {
        let now = clock.now();
        match ev {
            Ev::Arrive(i) => {
                let r = requests[i];
                match mode {
                    Mode::CloudOnly => {
                        kv[i] = Kv::CloudOnly;
                        // Until a request's prefill has put the prompt in the cache, each
                        // prefills it whole.
                        let mut j = job(i);
                        if !cloud_has[r.prompt] {
                            caching[r.prompt].get_or_insert(i);
                            j.prompt += j.prefix;
                            j.prefix = 0;
                        }
                        submit(&mut clock, &mut nodes, cloud_node, j);
                    }
                    Mode::EdgePrompt => {
                        let (e, p) = (r.edge, r.prompt);
                        if edge_has[e][p] {
                            submit(&mut clock, &mut nodes, e, job(i));
                        } else if let Some((from, w)) = fetching.get_mut(&(e, p)) {
                            kv[i] = *from;
                            w.push(i);
                        } else {
                            let from = if cloud_has[p] {
                                Kv::Cloud
                            } else {
                                Kv::Prefilled
                            };
                            fetching.insert((e, p), (from, vec![i]));
                            kv[i] = from;
                            if cloud_has[p] {
                                fetch(&mut clock, e, p);
                            } else {
                                let waiting = prefilling.entry(p).or_default();
                                waiting.push(e);
                                if waiting.len() == 1 {
                                    if let Some((p, s)) =
                                        prefill.arrive(p, f.cloud.prefill_secs(f.prompts[p]))
                                    {
                                        clock.schedule(s, Ev::Prefilled(p));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Ev::Prefilled(p) => {
                cloud_has[p] = true;
                for e in prefilling.remove(&p).unwrap_or_default() {
                    fetch(&mut clock, e, p);
                }
                if let Some((p, s)) = prefill.depart() {
                    clock.schedule(s, Ev::Prefilled(p));
                }
            }
            Ev::Landed(e, p) => {
                edge_has[e][p] = true;
                for i in fetching.remove(&(e, p)).map(|x| x.1).unwrap_or_default() {
                    submit(&mut clock, &mut nodes, e, job(i));
                }
            }
            Ev::Kick(n) => {
                if nodes[n].idle() {
                    if let Some(s) = nodes[n].step(costs(n)) {
                        clock.schedule(s.secs, Ev::StepEnd(n, s.first_tokens, s.finished));
                    }
                }
            }
            Ev::StepEnd(n, firsts, finished) => {
                let wire = match mode {
                    Mode::CloudOnly => f.client_link.rtt_secs,
                    Mode::EdgePrompt => 0.0,
                };
                for i in firsts {
                    first[i] = Some(now + wire);
                    let p = requests[i].prompt;
                    if mode == Mode::CloudOnly && caching[p] == Some(i) {
                        cloud_has[p] = true;
                    }
                }
                for i in finished {
                    let r = &requests[i];
                    let ttft = first[i].unwrap_or(now + wire) - r.at;
                    out[i] = Some(Outcome {
                        ttft,
                        latency: now + wire - r.at,
                        output: r.output,
                        kv: kv[i],
                    });
                }
                if let Some(s) = nodes[n].step(costs(n)) {
                    clock.schedule(s.secs, Ev::StepEnd(n, s.first_tokens, s.finished));
                }
            }
        }
    }
    out.into_iter()
        .map(|o| {
            o.unwrap_or(Outcome {
                ttft: f64::INFINITY,
                latency: f64::INFINITY,
                output: 0,
                kv: Kv::Memory,
            })
        })
        .collect()
}
