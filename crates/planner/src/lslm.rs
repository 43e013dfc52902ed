//! CE-LSLM §V-C: which layers of the cloud prompt the edge's small model computes itself and
//! which it loads from the cloud through the adapters (eq. 19), with loading overlapping
//! computing (eq. 20). The edge computes cloud-prompt layers `0..s` and its private prompt's
//! layers on the same cores; layers `s..` arrive over the link meanwhile, and private layer
//! `l >= s` starts once layer `l` is in and layer `l - 1` is done.

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct SplitInputs {
    /// Edge compute of the cloud prompt, per layer (what loading a layer saves).
    pub prompt_layer_secs: Vec<f64>,
    /// Edge compute of the private prompt, per layer.
    pub private_layer_secs: Vec<f64>,
    /// Wire bytes of each layer's mapped KV.
    pub layer_bytes: Vec<usize>,
    pub bandwidth_bps: f64,
    pub rtt_secs: f64,
    /// Before the first byte: the cloud's prefill and mapping (0 when cached).
    pub cloud_secs: f64,
    pub head_secs: f64,
    /// Layers below this cannot be loaded (no matched cloud layer, or quality).
    pub min_split: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct SplitPlan {
    /// The chosen split: layers `split..` come from the cloud.
    pub split: usize,
    pub ttft_secs: f64,
    /// Predicted TTFT for every allowed split, `(split, secs)`.
    pub curve: Vec<(usize, f64)>,
    /// Eq. 19 per layer: loading is cheaper than computing.
    pub load_cheaper: Vec<bool>,
}

/// Predicted TTFT when layers `split..` are loaded.
pub fn ttft(x: &SplitInputs, split: usize) -> f64 {
    let n = x.private_layer_secs.len();
    let split = split.min(n);
    let mut done: f64 = (0..split)
        .map(|l| x.prompt_layer_secs[l] + x.private_layer_secs[l])
        .sum();
    let mut arrived = x.rtt_secs + x.cloud_secs;
    for l in split..n {
        arrived += transfer(x, l);
        done = done.max(arrived) + x.private_layer_secs[l];
    }
    done + x.head_secs
}

fn transfer(x: &SplitInputs, l: usize) -> f64 {
    if x.bandwidth_bps <= 0.0 {
        f64::INFINITY
    } else {
        x.layer_bytes[l] as f64 * 8.0 / x.bandwidth_bps
    }
}

/// The split with the lowest predicted TTFT among `min_split..=n` (`n` = all local).
pub fn plan(x: &SplitInputs) -> SplitPlan {
    let n = x.private_layer_secs.len();
    assert!(
        x.prompt_layer_secs.len() == n && x.layer_bytes.len() == n,
        "per-layer inputs differ in length"
    );
    let curve: Vec<(usize, f64)> = (x.min_split.min(n)..=n).map(|s| (s, ttft(x, s))).collect();
    let (split, ttft_secs) = curve
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((n, ttft(x, n)));
    let load_cheaper = (0..n)
        .map(|l| transfer(x, l) < x.prompt_layer_secs[l])
        .collect();
    SplitPlan {
        split,
        ttft_secs,
        curve,
        load_cheaper,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(bw: f64) -> SplitInputs {
        SplitInputs {
            prompt_layer_secs: vec![0.1; 8],
            private_layer_secs: vec![0.01; 8],
            layer_bytes: vec![1_000_000; 8],
            bandwidth_bps: bw,
            rtt_secs: 0.0,
            cloud_secs: 0.0,
            head_secs: 0.0,
            min_split: 2,
        }
    }

    #[test]
    fn all_local_is_the_sum_of_compute() {
        let x = inputs(1e9);
        assert!((ttft(&x, 8) - 8.0 * 0.11).abs() < 1e-12);
    }

    #[test]
    fn a_fast_link_loads_everything_allowed_and_a_slow_one_nothing() {
        // 1 MB at 1 Gbit/s = 8 ms per layer < 100 ms of compute: load from the minimum split.
        let fast = plan(&inputs(1e9));
        assert_eq!(fast.split, 2);
        assert!(fast.load_cheaper.iter().all(|&b| b));
        // Split 2: 0.22 s local, then 6 layers of 8 ms arriving from t = 0 (already in).
        assert!((fast.ttft_secs - (0.22 + 6.0 * 0.01)).abs() < 1e-9);
        // 1 MB at 1 Mbit/s = 8 s per layer: computing is cheaper everywhere.
        let slow = plan(&inputs(1e6));
        assert_eq!(slow.split, 8);
        assert_eq!(slow.curve.len(), 7);
        assert!(slow.load_cheaper.iter().all(|&b| !b));
        // At 10 Mbit/s (0.8 s per layer) eq. 19 alone would compute every layer, but the last
        // layer loads while the other seven are computed (0.77 s): the overlap wins (eq. 20).
        let mid = plan(&inputs(1e7));
        assert!(mid.load_cheaper.iter().all(|&b| !b));
        assert_eq!(mid.split, 7);
        assert!((mid.ttft_secs - 0.81).abs() < 1e-9);
    }

    #[test]
    fn the_middle_of_the_range_when_transfer_and_compute_are_close() {
        // 0.1 s per loaded layer vs 0.11 s per local layer: loading the deep layers while the
        // shallow ones are computed balances the two paths (eq. 20).
        let mut x = inputs(8e7);
        x.min_split = 0;
        let p = plan(&x);
        assert!(p.split > 0 && p.split < 8, "{p:?}");
        assert!(p.ttft_secs < ttft(&x, 0) && p.ttft_secs < ttft(&x, 8));
    }
}
