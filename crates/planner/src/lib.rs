//! The latency model of EdgePrompt §2.3: per layer, the cloud computes (t_cc) and transmits
//! (t_ct) the cloud prompt's KV, and the edge computes its private prompt (t_ec) once that
//! layer is in. Eq. 6 is the sequential time, eq. 7 the pipelined one:
//!
//!   T_pipe = (t_cc¹ + t_ct¹) + max[Σ_{l≥2} (t_cc + t_ct), Σ_{l<L} t_ec] + t_ec^L
//!
//! The planner evaluates the exact two-stage pipeline recurrence (eq. 7 is its closed form
//! when per-layer times are even), names the regime (P1 transmission-bound, P2 edge-compute
//! bound, P3 mixed) and predicts TTFT from measured bandwidth and per-layer compute time.

pub mod fleet;
pub mod lslm;

use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Inputs {
    /// Cloud compute per layer (0 when the prompt's KV is cached).
    pub cloud_layer_secs: Vec<f64>,
    /// Bytes of cloud KV per layer on the wire.
    pub layer_bytes: Vec<usize>,
    pub bandwidth_bps: f64,
    pub rtt_secs: f64,
    /// Edge compute of the private prompt per layer.
    pub edge_layer_secs: Vec<f64>,
    /// Final norm, output head and first sample.
    pub head_secs: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Regime {
    /// Transmission-bound: the link is the bottleneck (P1, eq. 12).
    P1,
    /// Edge-compute-bound: the edge's private prompt is the bottleneck (P2, eq. 13).
    P2,
    /// Mixed: neither dominates by more than 20 % (P3).
    P3,
}

#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub sequential_secs: f64,
    pub pipelined_secs: f64,
    /// Eq. 7's closed form, for comparison with the recurrence.
    pub eq7_secs: f64,
    pub regime: Regime,
    pub transfer_secs: f64,
    pub edge_compute_secs: f64,
}

impl Inputs {
    fn transfer(&self, l: usize) -> f64 {
        if self.bandwidth_bps <= 0.0 {
            0.0
        } else {
            self.layer_bytes[l] as f64 * 8.0 / self.bandwidth_bps
        }
    }
}

pub fn predict(x: &Inputs) -> Prediction {
    let n = x.edge_layer_secs.len();
    assert!(
        x.layer_bytes.len() == n && x.cloud_layer_secs.len() == n,
        "per-layer inputs differ in length"
    );
    let supply: Vec<f64> = (0..n)
        .map(|l| x.cloud_layer_secs[l] + x.transfer(l))
        .collect();
    let first_byte = x.rtt_secs;
    // Pipeline: layer l can start when it has arrived and layer l-1 is done.
    let (mut arrived, mut done) = (first_byte, first_byte);
    for (s, c) in supply.iter().zip(&x.edge_layer_secs) {
        arrived += s;
        done = done.max(arrived) + c;
    }
    let pipelined = done + x.head_secs;
    let transfer: f64 = supply.iter().sum();
    let compute: f64 = x.edge_layer_secs.iter().sum();
    let sequential = first_byte + transfer + compute + x.head_secs;
    let eq7 = if n == 0 {
        first_byte + x.head_secs
    } else {
        first_byte
            + supply[0]
            + supply[1..]
                .iter()
                .sum::<f64>()
                .max(x.edge_layer_secs[..n - 1].iter().sum())
            + x.edge_layer_secs[n - 1]
            + x.head_secs
    };
    let regime = if transfer > 1.2 * compute {
        Regime::P1
    } else if compute > 1.2 * transfer {
        Regime::P2
    } else {
        Regime::P3
    };
    Prediction {
        sequential_secs: sequential,
        pipelined_secs: pipelined,
        eq7_secs: eq7,
        regime,
        transfer_secs: transfer,
        edge_compute_secs: compute,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn even(n: usize, t_ct: f64, t_ec: f64) -> Inputs {
        Inputs {
            cloud_layer_secs: vec![0.0; n],
            layer_bytes: vec![(t_ct * 1e9 / 8.0) as usize; n],
            bandwidth_bps: 1e9,
            rtt_secs: 0.01,
            edge_layer_secs: vec![t_ec; n],
            head_secs: 0.0,
        }
    }

    #[test]
    fn pipeline_regimes_and_eq7() {
        // Transfer-bound: T = rtt + L*t_ct + t_ec.
        let p = predict(&even(10, 0.02, 0.005));
        assert!((p.pipelined_secs - (0.01 + 0.2 + 0.005)).abs() < 1e-6);
        assert_eq!(p.regime, Regime::P1);
        // Compute-bound: T = rtt + t_ct + L*t_ec.
        let p = predict(&even(10, 0.005, 0.02));
        assert!((p.pipelined_secs - (0.01 + 0.005 + 0.2)).abs() < 1e-6);
        assert_eq!(p.regime, Regime::P2);
        assert!(
            (p.eq7_secs - p.pipelined_secs).abs() < 1e-6,
            "even layers: eq. 7 is exact"
        );
        // Sequential is never faster than pipelined.
        assert!(p.sequential_secs >= p.pipelined_secs);
        assert_eq!(predict(&even(10, 0.01, 0.0095)).regime, Regime::P3);
    }
}
