//! What the edge measures of its link to the cloud on every fetch, for the choices made per
//! fetch (`--codec auto`, `--cloud-layers-from auto`).

use std::sync::Mutex;
use std::time::Duration;

/// The link as measured: the fastest of the last few fetches (a cold prompt's stream is paced
/// by the cloud's prefill, not by the link).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkEstimate {
    pub rtt: Duration,
    pub bytes_per_sec: f64,
}

/// Fetches the estimate looks back over.
const WINDOW: usize = 8;

#[derive(Debug, Default)]
pub struct LinkMeter {
    /// The last fetches, newest last.
    seen: Mutex<Vec<LinkEstimate>>,
}

impl LinkMeter {
    pub fn link(&self) -> Option<LinkEstimate> {
        let g = self.seen.lock().ok()?;
        g.iter()
            .copied()
            .max_by(|a, b| a.bytes_per_sec.total_cmp(&b.bytes_per_sec))
    }

    /// A fetch of `bytes` on the wire took `secs` after the header came `rtt` after the request.
    pub fn observe(&self, rtt: Duration, bytes: usize, secs: f64) {
        if bytes == 0 || secs <= 0.0 {
            return;
        }
        if let Ok(mut g) = self.seen.lock() {
            g.push(LinkEstimate {
                rtt,
                bytes_per_sec: bytes as f64 / secs,
            });
            let extra = g.len().saturating_sub(WINDOW);
            g.drain(..extra);
        }
    }
}
