//! The seeded fault schedule: which fault, where, when, for how long.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// SIGTERM Redis (it saves its data), started again at `StartRedis`.
    StopRedis,
    StartRedis,
    /// SIGKILL a cloud node, started again after `hold_s`.
    KillCloud,
    /// Kill the link process (every connection through it drops), started again after `hold_s`.
    CutLink,
    /// The edge's disk cache cannot be written (nor read) for `hold_s`.
    DiskUnwritable,
    /// A burst of long requests on one edge that takes its KV budget.
    FillBudget,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::StopRedis,
        Kind::StartRedis,
        Kind::KillCloud,
        Kind::CutLink,
        Kind::DiskUnwritable,
        Kind::FillBudget,
    ];
}

#[derive(Debug, Clone, Serialize)]
pub struct Fault {
    pub kind: Kind,
    /// Cloud, link or edge index (0 or 1); Redis faults have 0.
    pub target: usize,
    /// Seconds after the load starts.
    pub at: f64,
    pub hold_s: f64,
}

/// One of each fault over a run of `secs`, in an order that shows each recovery: Redis goes
/// away, a cloud node dies while it is away (and restarts without it), Redis returns, the
/// other cloud node dies (and restarts from Redis), a link is cut, a disk cache cannot be written, a
/// burst takes an edge's KV budget. Times jitter with the seed.
pub fn schedule(secs: f64, seed: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xC4A0_5EED);
    let mut at = |f: f64| secs * (f + rng.random_range(-0.02..0.02));
    let hold = (secs * 0.05).clamp(2.0, 8.0);
    vec![
        Fault {
            kind: Kind::StopRedis,
            target: 0,
            at: at(0.12),
            hold_s: 0.0,
        },
        Fault {
            kind: Kind::KillCloud,
            target: 1,
            at: at(0.20),
            hold_s: 2.0,
        },
        Fault {
            kind: Kind::StartRedis,
            target: 0,
            at: at(0.32),
            hold_s: 0.0,
        },
        Fault {
            kind: Kind::KillCloud,
            target: 0,
            at: at(0.42),
            hold_s: 2.0,
        },
        Fault {
            kind: Kind::CutLink,
            target: 0,
            at: at(0.55),
            hold_s: hold,
        },
        Fault {
            kind: Kind::DiskUnwritable,
            target: 1,
            at: at(0.66),
            hold_s: hold,
        },
        Fault {
            kind: Kind::FillBudget,
            target: 0,
            at: at(0.78),
            hold_s: 0.0,
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_has_each_fault_in_order_within_the_run() {
        let s = schedule(60.0, 7);
        assert_eq!(s.len(), 7);
        assert!(s.windows(2).all(|w| w[0].at < w[1].at));
        assert!(s.iter().all(|f| f.at > 0.0 && f.at + f.hold_s < 60.0));
        let kinds: Vec<Kind> = s.iter().map(|f| f.kind).collect();
        for k in Kind::ALL {
            assert!(kinds.contains(&k), "{k:?}");
        }
        assert_eq!(schedule(60.0, 7)[3].at, s[3].at, "seeded");
    }
}
