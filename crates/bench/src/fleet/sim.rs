//! The measured traces through the simulator: the same arrivals, servers, cloud prompts and
//! token counts, with the costs fitted on this machine; its error against the measurement.

use edgeprompt_planner::fleet::model::{simulate, Costs, Fleet, Link, Mode, Request};

use super::{kv_name, summarize_with, Outcome, Report};
use crate::BenchError;

/// Requests far enough apart to warm every server without queueing.
const WARM_GAP: f64 = 30.0;

/// The fleet a setup of the report ran, as the simulator sees it.
pub fn fleet_of(r: &Report, setup: &str, n_layer: usize) -> Result<(Fleet, Mode), BenchError> {
    let costs = |node: &str| -> Result<Costs, BenchError> {
        r.calibration
            .iter()
            .find(|c| c.node == node)
            .map(|c| c.costs)
            .ok_or_else(|| BenchError::Data(format!("no calibration of the {node} node")))
    };
    let profile = edgeprompt_link::Profile::named(&r.link)
        .ok_or_else(|| BenchError::Data(format!("unknown link profile {}", r.link)))?;
    let link = Link {
        bytes_per_sec: if profile.bandwidth_bps == 0 {
            1e12
        } else {
            profile.bandwidth_bps as f64 / 8.0
        },
        rtt_secs: profile.rtt.as_secs_f64(),
    };
    let loopback = Link {
        bytes_per_sec: 1e12,
        rtt_secs: 0.0,
    };
    let tokens = cloud_tokens(r);
    let (mode, edges, cloud) = match setup.strip_prefix("edgeprompt-") {
        Some(n) => (Mode::EdgePrompt, n.parse().unwrap_or(1), costs("cloud")?),
        None => (Mode::CloudOnly, 0, costs("cloud-only")?),
    };
    let edge = if mode == Mode::EdgePrompt {
        costs("edge")?
    } else {
        cloud
    };
    Ok((
        Fleet {
            kv_bytes_per_token: r.kv_bytes_per_token.round() as usize,
            edge_layers: if r.cloud_model == r.edge_model {
                0.0
            } else {
                r.split as f64 / n_layer.max(1) as f64
            },
            client_link: loopback,
            prompts: tokens,
            ..Fleet::new(edges, edge, cloud, link)
        },
        mode,
    ))
}

/// Each cloud prompt's token count as the servers reported it (the prefix length otherwise).
fn cloud_tokens(r: &Report) -> Vec<usize> {
    let mut t = vec![r.prefix_len; r.prompts];
    for p in &r.points {
        for x in &p.records {
            if x.cloud_tokens > 0 && x.prompt < t.len() {
                t[x.prompt] = x.cloud_tokens;
            }
        }
    }
    t
}

/// Fill each point's `simulated` and `latency_error` (llama-server's stay empty).
pub fn replay(r: &mut Report, n_layer: usize) -> Result<(), BenchError> {
    let mut filled = Vec::new();
    for (i, p) in r.points.iter().enumerate() {
        if p.setup == "llama-server" {
            continue;
        }
        let (mut fleet, mode) = fleet_of(r, &p.setup, n_layer)?;
        let oh = r.overheads.iter().find(|o| o.setup == p.setup);
        let (step_oh, seq_oh, req_oh) = oh.map_or((0.0, 0.0, 0.0), |o| {
            (o.step_secs, o.seq_secs, o.request_secs)
        });
        // The server's own time per step lands on every step, of edges and cloud-only alike.
        fleet.edge.fixed += step_oh;
        fleet.edge.per_seq += seq_oh;
        if mode == Mode::CloudOnly {
            fleet.cloud.fixed += step_oh;
            fleet.cloud.per_seq += seq_oh;
        }
        let servers = fleet.edges.max(1);
        // Warm-up as the run did it: every prompt once at every server, far apart.
        let mut reqs = Vec::new();
        for e in 0..servers {
            for prompt in 0..fleet.prompts.len() {
                reqs.push(Request {
                    at: reqs.len() as f64 * WARM_GAP,
                    edge: e,
                    prompt,
                    private: 8,
                    output: 2,
                });
            }
        }
        let warm = reqs.len();
        let t0 = warm as f64 * WARM_GAP;
        let ok: Vec<_> = p.records.iter().filter(|x| x.latency_s.is_some()).collect();
        for x in &ok {
            reqs.push(Request {
                // Each request reaches the scheduler `req_oh` after it was sent.
                at: t0 + x.at + req_oh,
                edge: x.edge % servers,
                prompt: x.prompt,
                private: x.private_tokens,
                output: x.tokens.max(1),
            });
        }
        let (out, _) = simulate(&fleet, mode, &reqs);
        let rows: Vec<_> = ok
            .iter()
            .zip(&out[warm..])
            .map(|(x, o)| Outcome {
                at: x.at,
                ttft: Some(o.ttft + req_oh),
                latency: Some(o.latency + req_oh),
                tokens: o.output,
                source: kv_name(o.kv).to_string(),
            })
            .collect();
        let sim = summarize_with(&rows);
        let err = (sim.mean_latency_s - p.measured.mean_latency_s) / p.measured.mean_latency_s;
        eprintln!(
            "  {:>14} {:6.2} req/s: measured {:6.2} s, simulated {:6.2} s ({:+.1} %); done {:.2} vs {:.2} req/s",
            p.setup, p.rate, p.measured.mean_latency_s, sim.mean_latency_s, err * 100.0,
            p.measured.req_s, sim.req_s
        );
        filled.push((i, sim, err));
    }
    for (i, sim, err) in filled {
        r.points[i].simulated = Some(sim);
        r.points[i].latency_error = Some(err);
    }
    Ok(())
}
