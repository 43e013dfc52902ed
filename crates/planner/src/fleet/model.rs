//! A fleet on the simulator's clock: cloud nodes, edges on their own links, requests on
//! shared cloud prompts; served the EdgePrompt way (a cloud prefills each prompt once, each
//! edge fetches its KV once, from a peer edge or the cloud, and answers everything else
//! itself) or cloud-only (the cloud model answers every request on the cloud's cores).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::server::{Batcher, Fifo, Job, StepCost, Work};
use super::Clock;

/// One model's costs on one node, fitted to measured forward passes: a pass costs `fixed`
/// (the weights streamed once), plus `per_token` per prompt token and `per_seq` per decoding
/// sequence (the matrix rows), plus `per_attend` per (token, earlier token) pair attended.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Costs {
    pub fixed: f64,
    pub per_token: f64,
    pub per_seq: f64,
    pub per_attend: f64,
}

impl Costs {
    /// One pass prefilling `n` tokens after `offset` held ones.
    pub fn prefill_secs(&self, n: usize, offset: usize) -> f64 {
        let (n, o) = (n as f64, offset as f64);
        self.fixed + n * self.per_token + n * (o + (n + 1.0) / 2.0) * self.per_attend
    }

    /// The same model on a node with `compute` times the arithmetic and `bandwidth` times the
    /// memory bandwidth of the measured one: the fixed part is streaming weights, the rest
    /// arithmetic.
    pub fn scaled(&self, compute: f64, bandwidth: f64) -> Costs {
        Costs {
            fixed: self.fixed / bandwidth,
            per_token: self.per_token / compute,
            per_seq: self.per_seq / compute,
            per_attend: self.per_attend / compute,
        }
    }
}

impl StepCost for Costs {
    fn step_secs(&self, w: &Work) -> f64 {
        self.fixed
            + w.decoding as f64 * self.per_seq
            + w.prefill as f64 * self.per_token
            + (w.context + w.prefill_attend) * self.per_attend
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Link {
    pub bytes_per_sec: f64,
    pub rtt_secs: f64,
}

impl Link {
    /// Edges' LAN between peers: 1 Gbit/s, 1 ms.
    pub const PEERS: Link = Link {
        bytes_per_sec: 1e9 / 8.0,
        rtt_secs: 0.001,
    };
    /// Cloud nodes to the shared Redis tier: 10 Gbit/s, 0.5 ms.
    pub const TIER: Link = Link {
        bytes_per_sec: 10e9 / 8.0,
        rtt_secs: 0.0005,
    };

    pub fn transfer(&self, bytes: usize) -> f64 {
        self.rtt_secs + bytes as f64 / self.bytes_per_sec
    }
}

/// Which cloud node an edge's fetch goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Home {
    /// Edge `e`'s node is `e % cloud_nodes` (each edge given one cloud URL).
    Edge,
    /// Each prompt's node by rendezvous hashing, as edges given every replica
    /// (`--cloud a,b,c`): a prompt is prefilled and held on one node.
    Prompt,
}

/// An object store (S3, or a CDN in front of it) the cloud nodes write each prefilled prompt
/// to and edges read published prompts from before asking the cloud.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Store {
    /// Bytes per second the store sends, all readers together.
    pub egress_bytes_per_sec: f64,
    /// Time to the first byte of an object.
    pub rtt_secs: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fleet {
    pub edges: usize,
    /// The edge model on an edge node.
    pub edge: Costs,
    /// The cloud model on a cloud node (its prefill of cloud prompts; cloud-only: all).
    pub cloud: Costs,
    /// Cloud nodes; cloud-only request `i` is served by node `i % cloud_nodes`, an edge's fetch
    /// by the node `home` picks.
    pub cloud_nodes: usize,
    pub home: Home,
    /// Cloud prompts one cloud node prefills at once.
    pub cloud_prefill_slots: usize,
    /// Machines the cloud nodes run on, node `c` on host `c % cloud_hosts`: nodes on one host
    /// share its prefill slots and its egress. 0: a host per node.
    pub cloud_hosts: usize,
    /// Cloud-only: sequences a cloud node decodes together.
    pub cloud_batch: usize,
    /// Prompt tokens a batching step takes (the edges' and the cloud-only cloud's).
    pub chunk: usize,
    pub edge_batch: usize,
    /// Wire bytes of one cloud-prompt token's KV (the layers the cloud sends, in the codec).
    pub kv_bytes_per_token: usize,
    /// Share of a cloud prompt's layers an edge computes itself while the rest loads (CE-LSLM's
    /// shallow layers; 0 when every layer comes from the cloud).
    pub edge_layers: f64,
    /// Each edge's link to its cloud node; clients reach edges on their own network.
    pub link: Link,
    /// A cloud node's egress in bytes per second, shared by its edges' fetches (None: only
    /// the edges' links limit).
    pub cloud_egress: Option<f64>,
    /// Edge-to-edge sharing: a cold edge fetches from an edge that holds the prompt, on this link.
    pub peer_link: Option<Link>,
    /// The shared tier (Redis): a cloud node loads a prompt another node prefilled over this
    /// link instead of prefilling it again (None: each node prefills its own).
    pub tier_link: Option<Link>,
    /// Edges read published prompts here (a cloud node writes each it prefills); it is also
    /// the shared tier of cloud nodes without `tier_link`.
    pub store: Option<Store>,
    /// Bytes of the cloud's signed list, sent once to each edge that asks the cloud or the
    /// store for a prompt.
    pub list_bytes: usize,
    /// Clients' link to the cloud (cloud-only).
    pub client_link: Link,
    /// Token counts of the cloud prompts.
    pub prompts: Vec<usize>,
    /// Prompts `0..prefilled` are held from the start by every cloud node, tier and store (a
    /// cloud prefills the prompts it publishes as it starts) ...
    pub prefilled: usize,
    /// ... and by every edge too: a fleet in steady state on its shared prompts. Otherwise the
    /// edges start without them (a rollout).
    pub edges_warm: bool,
}

impl Fleet {
    /// One cloud node with one prefill slot, the servers' batches (32 sequences, 256-token
    /// chunks), every layer from the cloud, clients on the edges' link, no egress limit, peers,
    /// tier or store, no prompts yet.
    pub fn new(edges: usize, edge: Costs, cloud: Costs, link: Link) -> Fleet {
        Fleet {
            edges,
            edge,
            cloud,
            cloud_nodes: 1,
            home: Home::Edge,
            cloud_prefill_slots: 1,
            cloud_hosts: 0,
            cloud_batch: 32,
            chunk: 256,
            edge_batch: 32,
            kv_bytes_per_token: 0,
            edge_layers: 0.0,
            link,
            cloud_egress: None,
            peer_link: None,
            tier_link: None,
            store: None,
            list_bytes: 0,
            client_link: link,
            prompts: Vec::new(),
            prefilled: 0,
            edges_warm: false,
        }
    }
}

/// One request: when, at which edge, on which cloud prompt, its own tokens in and out.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Request {
    pub at: f64,
    pub edge: usize,
    pub prompt: usize,
    pub private: usize,
    pub output: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kv {
    /// The edge held the prompt's KV.
    Memory,
    /// The edge fetched it from a peer edge.
    Peer,
    /// The edge read it from the object store.
    Store,
    /// The edge fetched it from a cloud node that held it.
    Cloud,
    /// ... that loaded it from the shared tier first.
    Tier,
    /// ... that prefilled it first.
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

/// What the nodes did over a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Usage {
    /// Seconds each cloud node spent prefilling cloud prompts (EdgePrompt) or stepping
    /// (cloud-only), per core slot summed; nodes sharing a host count on its index (the
    /// host is what is busy).
    pub cloud_busy_secs: Vec<f64>,
    pub edge_busy_secs: Vec<f64>,
    /// Cloud prompts prefilled, over all cloud nodes.
    pub cloud_prefills: usize,
    /// Bytes sent by cloud nodes, by peer edges and by the store.
    pub cloud_bytes: f64,
    pub peer_bytes: f64,
    pub store_bytes: f64,
    /// Seconds the store's egress was sending.
    pub store_busy_secs: f64,
    /// Most cloud prompts waiting in one cloud node's prefill queue.
    pub max_prefill_queue: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    EdgePrompt,
    CloudOnly,
}

enum Ev {
    Arrive(usize),
    /// Cloud node `c` holds prompt `p`: prefilled (`true`; its prefill slot frees), or loaded
    /// from the tier.
    Held(usize, usize, bool),
    /// `from`'s egress finished sending prompt `p` to edge `e`.
    Sent(Src, usize, usize),
    /// Prompt `p`'s KV is in at edge `e` (wire and the edge's own layers).
    Landed(usize, usize),
    /// Node `n` (edges 0.., then the cloud nodes) starts a step if it is idle.
    Kick(usize),
    /// A batching step of node `n` ended: the requests it gave a first token, and finished.
    StepEnd(usize, Vec<usize>, Vec<usize>),
}

/// Who sends an edge a prompt.
#[derive(Clone, Copy)]
enum Src {
    /// A cloud host's egress.
    Cloud(usize),
    Peer,
    Store,
}

/// The node rendezvous hashing gives prompt `p` among `nodes`: the highest mix of (node,
/// prompt), so a node that goes moves only its own prompts.
pub fn rendezvous(p: usize, nodes: usize) -> usize {
    let mix = |x: u64| {
        // splitmix64's finaliser.
        let x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    };
    (0..nodes.max(1))
        .max_by_key(|&n| mix(((n as u64) << 40) ^ p as u64 ^ 0x9e37_79b9_7f4a_7c15))
        .unwrap_or(0)
}

/// A fetch under way at an edge: where it comes from, the requests waiting, and when the
/// edge's own share of the layers is computed.
struct Fetch {
    from: Kv,
    waiting: Vec<usize>,
    local_ready: f64,
}

/// Simulate `requests` (sorted by time): one outcome per request, in order, and the usage.
pub fn simulate(f: &Fleet, mode: Mode, requests: &[Request]) -> (Vec<Outcome>, Usage) {
    let mut clock: Clock<Ev> = Clock::default();
    for (i, r) in requests.iter().enumerate() {
        clock.schedule(r.at, Ev::Arrive(i));
    }
    let clouds = f.cloud_nodes.max(1);
    let n_prompts = f.prompts.len();
    let prefilled = f.prefilled.min(n_prompts);
    let held = if f.edges_warm { prefilled } else { 0 };
    let mut nodes: Vec<Batcher<usize>> = (0..f.edges)
        .map(|_| Batcher::new(f.edge_batch, f.chunk))
        .chain((0..clouds).map(|_| Batcher::new(f.cloud_batch, f.chunk)))
        .collect();
    let costs = |n: usize| if n >= f.edges { &f.cloud } else { &f.edge };
    // Cloud nodes on shared hosts share its prefill slots and egress (node `c` on host
    // `c % hosts`).
    let hosts = match f.cloud_hosts {
        0 => clouds,
        h => h.min(clouds),
    };
    let host = |c: usize| c % hosts;
    let mut prefill: Vec<Fifo<(usize, usize)>> = (0..hosts)
        .map(|_| Fifo::new(f.cloud_prefill_slots))
        .collect();
    let mut egress: Vec<Fifo<(usize, usize)>> = (0..hosts).map(|_| Fifo::new(1)).collect();
    let mut store_egress: Fifo<(usize, usize)> = Fifo::new(1);
    let mut cloud_has = vec![vec![false; n_prompts]; clouds];
    let mut tier_has = vec![false; n_prompts];
    let mut store_has = vec![false; n_prompts];
    for p in 0..prefilled {
        for c in &mut cloud_has {
            c[p] = true;
        }
        tier_has[p] = true;
        store_has[p] = f.store.is_some();
    }
    // Cloud-only: the request whose prefill puts each prompt in its node's cache.
    let mut caching: Vec<Vec<Option<usize>>> = vec![vec![None; n_prompts]; clouds];
    let mut fetching: HashMap<(usize, usize), Fetch> = HashMap::new();
    // (cloud node, prompt) being prefilled or loaded -> edges waiting on it.
    let mut getting: HashMap<(usize, usize), Vec<usize>> = HashMap::new();
    // What each edge holds beyond the prompts held from the start (a set, not a table: a
    // million edges and every fresh prompt).
    let mut edge_has: HashSet<(usize, usize)> = HashSet::new();
    let mut holders: Vec<usize> = (0..n_prompts)
        .map(|p| if p < held { f.edges } else { 0 })
        .collect();
    // Edges that have the cloud's list (any edge holding a prompt was sent it).
    let mut listed = vec![held > 0; f.edges];
    let mut first: Vec<Option<f64>> = vec![None; requests.len()];
    let mut out: Vec<Option<Outcome>> = vec![None; requests.len()];
    let mut kv = vec![Kv::Memory; requests.len()];
    let mut usage = Usage {
        cloud_busy_secs: vec![0.0; clouds],
        edge_busy_secs: vec![0.0; f.edges],
        ..Usage::default()
    };

    let bytes = |p: usize| f.prompts[p] * f.kv_bytes_per_token;
    let home = |e: usize, p: usize| match f.home {
        Home::Edge => e % clouds,
        Home::Prompt => rendezvous(p, clouds),
    };
    // The tier a cloud node loads another's prompt from: Redis, else the store.
    let tier_link = f.tier_link.or(f.store.map(|s| Link {
        bytes_per_sec: s.egress_bytes_per_sec,
        rtt_secs: s.rtt_secs,
    }));
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
    // Cloud node `c` sends prompt `p` to edge `e` through its egress.
    let send = |clock: &mut Clock<Ev>,
                egress: &mut Vec<Fifo<(usize, usize)>>,
                c: usize,
                e: usize,
                p: usize| {
        let service = f.cloud_egress.map_or(0.0, |b| bytes(p) as f64 / b);
        if let Some(((e, p), s)) = egress[host(c)].arrive((e, p), service) {
            clock.schedule(s, Ev::Sent(Src::Cloud(host(c)), e, p));
        }
    };
    let store_service = |p: usize| {
        f.store
            .map_or(0.0, |s| bytes(p) as f64 / s.egress_bytes_per_sec)
    };

    while let Some(ev) = clock.advance() {
        let now = clock.now();
        match ev {
            Ev::Arrive(i) => {
                let r = requests[i];
                match mode {
                    Mode::CloudOnly => {
                        kv[i] = Kv::CloudOnly;
                        let c = i % clouds;
                        // Until a request's prefill has put the prompt in the cache, each
                        // prefills it whole.
                        let mut j = job(i);
                        if !cloud_has[c][r.prompt] {
                            caching[c][r.prompt].get_or_insert(i);
                            j.prompt += j.prefix;
                            j.prefix = 0;
                        }
                        submit(&mut clock, &mut nodes, f.edges + c, j);
                    }
                    Mode::EdgePrompt => {
                        let (e, p) = (r.edge, r.prompt);
                        if p < held || edge_has.contains(&(e, p)) {
                            submit(&mut clock, &mut nodes, e, job(i));
                            continue;
                        }
                        if let Some(x) = fetching.get_mut(&(e, p)) {
                            kv[i] = x.from;
                            x.waiting.push(i);
                            continue;
                        }
                        let local = if f.edge_layers > 0.0 {
                            f.edge.prefill_secs(f.prompts[p], 0) * f.edge_layers
                        } else {
                            0.0
                        };
                        let c = home(e, p);
                        let peer = f.peer_link.filter(|_| holders[p] > 0);
                        if peer.is_none() && !std::mem::replace(&mut listed[e], true) {
                            usage.cloud_bytes += f.list_bytes as f64;
                        }
                        let from = match peer {
                            Some(l) => {
                                usage.peer_bytes += bytes(p) as f64;
                                clock.schedule(l.transfer(bytes(p)), Ev::Sent(Src::Peer, e, p));
                                Kv::Peer
                            }
                            None if store_has[p] => {
                                let s = store_service(p);
                                if let Some(((e, p), s)) = store_egress.arrive((e, p), s) {
                                    clock.schedule(s, Ev::Sent(Src::Store, e, p));
                                }
                                Kv::Store
                            }
                            _ if cloud_has[c][p] => {
                                send(&mut clock, &mut egress, c, e, p);
                                Kv::Cloud
                            }
                            _ => {
                                let waiting = getting.entry((c, p)).or_default();
                                waiting.push(e);
                                let tier = tier_link.filter(|_| tier_has[p]);
                                if waiting.len() == 1 {
                                    if let Some(l) = tier {
                                        clock.schedule(l.transfer(bytes(p)), Ev::Held(c, p, false));
                                    } else {
                                        let s = f.cloud.prefill_secs(f.prompts[p], 0);
                                        usage.cloud_busy_secs[host(c)] += s;
                                        usage.cloud_prefills += 1;
                                        if let Some(((c, p), s)) =
                                            prefill[host(c)].arrive((c, p), s)
                                        {
                                            clock.schedule(s, Ev::Held(c, p, true));
                                        }
                                        usage.max_prefill_queue =
                                            usage.max_prefill_queue.max(prefill[host(c)].queued());
                                    }
                                }
                                if tier.is_some() {
                                    Kv::Tier
                                } else {
                                    Kv::Prefilled
                                }
                            }
                        };
                        kv[i] = from;
                        fetching.insert(
                            (e, p),
                            Fetch {
                                from,
                                waiting: vec![i],
                                local_ready: now + local,
                            },
                        );
                    }
                }
            }
            Ev::Held(c, p, prefilled) => {
                cloud_has[c][p] = true;
                tier_has[p] = true;
                store_has[p] |= f.store.is_some();
                for e in getting.remove(&(c, p)).unwrap_or_default() {
                    send(&mut clock, &mut egress, c, e, p);
                }
                if prefilled {
                    if let Some(((c, p), s)) = prefill[host(c)].depart() {
                        clock.schedule(s, Ev::Held(c, p, true));
                    }
                }
            }
            Ev::Sent(from, e, p) => {
                let ready = fetching.get(&(e, p)).map_or(now, |x| x.local_ready);
                // The edge's link carries the bytes as the egress sends them: what is left is
                // its own time beyond the egress's.
                let rest = match from {
                    Src::Cloud(h) => {
                        usage.cloud_bytes += bytes(p) as f64;
                        let service = f.cloud_egress.map_or(0.0, |b| bytes(p) as f64 / b);
                        if let Some(((e2, p2), s)) = egress[h].depart() {
                            clock.schedule(s, Ev::Sent(Src::Cloud(h), e2, p2));
                        }
                        (f.link.transfer(bytes(p)) - service).max(0.0)
                    }
                    Src::Store => {
                        usage.store_bytes += bytes(p) as f64;
                        let service = store_service(p);
                        usage.store_busy_secs += service;
                        if let Some(((e2, p2), s)) = store_egress.depart() {
                            clock.schedule(s, Ev::Sent(Src::Store, e2, p2));
                        }
                        let rtt = f.store.map_or(0.0, |s| s.rtt_secs);
                        (rtt + bytes(p) as f64 / f.link.bytes_per_sec - service).max(0.0)
                    }
                    Src::Peer => 0.0,
                };
                clock.schedule((now + rest).max(ready) - now, Ev::Landed(e, p));
            }
            Ev::Landed(e, p) => {
                edge_has.insert((e, p));
                holders[p] += 1;
                for i in fetching
                    .remove(&(e, p))
                    .map(|x| x.waiting)
                    .unwrap_or_default()
                {
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
                    let (p, c) = (requests[i].prompt, i % clouds);
                    if mode == Mode::CloudOnly && caching[c][p] == Some(i) {
                        cloud_has[c][p] = true;
                    }
                }
                for i in finished {
                    let r = &requests[i];
                    out[i] = Some(Outcome {
                        ttft: first[i].unwrap_or(now + wire) - r.at,
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
    for (n, b) in nodes.iter().enumerate() {
        if n < f.edges {
            usage.edge_busy_secs[n] = b.busy_secs;
        } else {
            usage.cloud_busy_secs[host(n - f.edges)] += b.busy_secs;
        }
    }
    let outcomes = out
        .into_iter()
        .map(|o| {
            o.unwrap_or(Outcome {
                ttft: f64::INFINITY,
                latency: f64::INFINITY,
                output: 0,
                kv: Kv::Memory,
            })
        })
        .collect();
    (outcomes, usage)
}
