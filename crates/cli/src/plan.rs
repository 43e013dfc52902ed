//! `edgeprompt plan`: N edges at R requests per second on these cloud prompts and links: how
//! many cloud nodes, what latency; and what serving every request from the cloud would take.
//! Answered by the fleet simulator on costs measured on real nodes (`edgeprompt-bench
//! fleet-grid` writes them).

use std::path::PathBuf;

use anyhow::Context;
use edgeprompt_planner::fleet::model::{Costs, Fleet, Home, Link, Mode};
use edgeprompt_planner::fleet::scenario::{plan, plan_with_store, Load, Plan};
use serde::Deserialize;

#[derive(clap::Args)]
pub struct PlanArgs {
    /// Edge nodes.
    #[arg(long)]
    edges: usize,
    /// Requests per second over the whole fleet.
    #[arg(long)]
    rate: f64,
    /// Shared cloud prompts in use.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    #[arg(long, default_value_t = 1024)]
    prompt_tokens: usize,
    /// Share of requests that bring a cloud prompt never used before (a fresh document).
    #[arg(long, default_value_t = 0.0)]
    fresh: f64,
    /// Private prompt tokens per request [default: ShareGPT's mean in the costs file].
    #[arg(long)]
    private_tokens: Option<usize>,
    /// Output tokens per request [default: ShareGPT's mean in the costs file].
    #[arg(long)]
    output_tokens: Option<usize>,
    /// Link between an edge and the cloud (and a client and the cloud): 6g, 5g, wifi, 4g, constrained.
    #[arg(long, default_value = "5g")]
    link: String,
    /// Cloud node egress, Gbit/s.
    #[arg(long, default_value_t = 10.0)]
    egress_gbit: f64,
    /// Edges fetch cloud prompts from each other on a 1 Gbit/s LAN.
    #[arg(long)]
    peers: bool,
    /// Cloud nodes share prefilled prompts through Redis (10 Gbit/s).
    #[arg(long)]
    shared_tier: bool,
    /// Edges are given every cloud node (`serve --cloud a,b,c`): each prompt has one home node,
    /// which alone prefills and sends it.
    #[arg(long)]
    every_replica: bool,
    /// Edges read published prompts from an object store (or a CDN in front of it) before
    /// the cloud: also size its egress (the least of 1, 2, 5 ... 5000 Gbit/s that keeps up).
    #[arg(long)]
    store: bool,
    /// The store's time to an object's first byte, in milliseconds.
    #[arg(long, default_value_t = 20.0)]
    store_rtt_ms: f64,
    /// Edges start without the prompts (a new deployment, or a new version of the prompts
    /// reaching every edge at once): every edge's first request on each prompt fetches it.
    /// Default: steady state, every edge holds them.
    #[arg(long)]
    rollout: bool,
    /// Cores of a cloud node: 2 (as measured) or 16 (8x the arithmetic, 3x the bandwidth).
    #[arg(long, default_value_t = 2)]
    cloud_cores: usize,
    /// Seconds of load simulated (after every edge holds the shared prompts).
    #[arg(long, default_value_t = 300.0)]
    secs: f64,
    /// Most cloud nodes tried.
    #[arg(long, default_value_t = 64)]
    max_nodes: usize,
    /// Costs measured on real nodes (`edgeprompt-bench fleet-grid`).
    #[arg(long, default_value = "docs/results/fleet-grid.json")]
    costs: PathBuf,
}

/// `fleet-grid.json` is about 80 KB; anything far larger is not one.
const MAX_COSTS_BYTES: u64 = 16 << 20;

#[derive(Deserialize)]
struct CostsFile {
    edge_model: String,
    cloud_model: String,
    edge_costs: Costs,
    cloud_costs: Costs,
    cloud16_costs: Costs,
    kv_bytes_per_token: usize,
    edge_layers: f64,
    mean_private: f64,
    mean_output: f64,
}

pub fn run(a: PlanArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.edges > 0 && a.rate > 0.0,
        "--edges and --rate must be positive"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&a.fresh),
        "--fresh is a share in [0, 1]"
    );
    let size = std::fs::metadata(&a.costs)
        .with_context(|| format!("reading {}", a.costs.display()))?
        .len();
    anyhow::ensure!(
        size <= MAX_COSTS_BYTES,
        "{} is {size} bytes: a costs file is at most {MAX_COSTS_BYTES}",
        a.costs.display()
    );
    let c: CostsFile = serde_json::from_slice(
        &std::fs::read(&a.costs).with_context(|| format!("reading {}", a.costs.display()))?,
    )
    .with_context(|| format!("{} is not a fleet-grid result", a.costs.display()))?;
    let profile = edgeprompt_link::Profile::named(&a.link)
        .with_context(|| format!("unknown link profile {}", a.link))?;
    let link = Link {
        bytes_per_sec: profile.bandwidth_bps.max(1) as f64 / 8.0,
        rtt_secs: profile.rtt.as_secs_f64(),
    };
    let cloud = match a.cloud_cores {
        2 => c.cloud_costs,
        16 => c.cloud16_costs,
        n => anyhow::bail!("--cloud-cores is 2 or 16 (measured, or modelled from it), not {n}"),
    };
    let fleet = Fleet {
        // As the grid's: the paper's cloud batches more than our server's 32.
        cloud_batch: 64,
        kv_bytes_per_token: c.kv_bytes_per_token,
        edge_layers: c.edge_layers,
        cloud_egress: Some(a.egress_gbit * 1e9 / 8.0),
        peer_link: a.peers.then_some(Link::PEERS),
        tier_link: a.shared_tier.then_some(Link::TIER),
        home: match a.every_replica {
            true => Home::Prompt,
            false => Home::Edge,
        },
        ..Fleet::new(a.edges, c.edge_costs, cloud, link)
    };
    let pair = (
        a.private_tokens
            .unwrap_or(c.mean_private.round() as usize)
            .max(1),
        a.output_tokens
            .unwrap_or(c.mean_output.round() as usize)
            .max(1),
    );
    let load = Load {
        rate: a.rate,
        secs: a.secs,
        prompts: a.prompts.max(1),
        prompt_tokens: a.prompt_tokens,
        fresh: a.fresh,
        lengths: vec![pair],
        seed: 1,
        rollout: a.rollout,
    };
    println!(
        "{} edges ({}, 2 cores each) at {} req/s over {} cloud prompts of {} tokens, {:.0} % fresh; {} private and {} output tokens a request; {} link",
        a.edges, c.edge_model, a.rate, a.prompts, a.prompt_tokens, a.fresh * 100.0, pair.0, pair.1, a.link
    );
    let ep = plan(&fleet, Mode::EdgePrompt, &load, a.max_nodes, 1.5, 0.8);
    show(
        &format!(
            "EdgePrompt (cloud {}, {} cores a node)",
            c.cloud_model, a.cloud_cores
        ),
        &ep,
    );
    if a.store {
        let (nodes, sized) =
            plan_with_store(&fleet, &load, a.store_rtt_ms / 1e3, a.max_nodes, 1.5, 0.8);
        show("EdgePrompt, edges reading the object store", &nodes);
        let s = &sized.stats;
        let what = match sized.enough {
            true => format!("{} Gbit/s of egress", sized.egress_gbit),
            false => format!("more than {} Gbit/s of egress", sized.egress_gbit),
        };
        println!("  object store: {what}");
        println!(
            "    latency {:.2} s mean (alone {:.2} s), TTFT {:.2} s p99; store {:.0} % busy, {:.2} GB served, {:.2} GB from the cloud",
            s.mean_latency_s, sized.lone_latency_s, s.ttft_p99_s, s.store_busy * 100.0, s.store_gb, s.cloud_gb
        );
    }
    let co = plan(&fleet, Mode::CloudOnly, &load, a.max_nodes, 1.5, 0.8);
    show(
        &format!("cloud-only ({} answers everything)", c.cloud_model),
        &co,
    );
    Ok(())
}

fn show(what: &str, p: &Plan) {
    let s = &p.stats;
    let nodes = if p.enough {
        format!("{} cloud node(s)", p.cloud_nodes)
    } else {
        format!("more than {} cloud nodes", p.cloud_nodes)
    };
    println!("\n{what}: {nodes}");
    println!(
        "  latency {:.2} s mean (alone {:.2} s), {:.3} s per output token, TTFT {:.2} s mean, {:.2} s p99",
        s.mean_latency_s, p.lone_latency_s, s.s_per_token, s.mean_ttft_s, s.ttft_p99_s
    );
    println!(
        "  busiest cloud node {:.0} % busy, busiest edge {:.0} %, {} cloud prefills, {:.2} GB from the cloud, {:.2} GB between peers",
        s.cloud_busy * 100.0, s.edge_busy * 100.0, s.cloud_prefills, s.cloud_gb, s.peer_gb
    );
    if p.edges_saturated {
        println!("  the edges are saturated: add edges, not cloud nodes");
    }
}
