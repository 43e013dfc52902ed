//! What the edge measures of its link to the cloud on every fetch, for the choices made per
//! fetch (`--codec auto`, `--cloud-layers-from auto`).

use std::sync::Mutex;
use std::time::Duration;

/// The link as measured: the fastest of the last few fetches (a cold prompt's stream is paced
/// by the cloud's prefill, not by the link). Small fetches do not count: what fits in a few
/// packets (or one buffer of a shaper) in flight at once times the link too fast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkEstimate {
    pub rtt: Duration,
    pub bytes_per_sec: f64,
}

/// Fetches the estimate looks back over.
const WINDOW: usize = 8;
/// Bytes a fetch must time to count.
const MIN_TIMED_BYTES: usize = 256 << 10;

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
        if bytes < MIN_TIMED_BYTES || secs <= 0.0 {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_fetches_do_not_count_and_slow_ones_do_not_drag_it_down() {
        let m = LinkMeter::default();
        let rtt = Duration::from_millis(40);
        m.observe(rtt, 40_000, 0.002);
        assert!(
            m.link().is_none(),
            "one shaper buffer's worth times nothing"
        );
        m.observe(rtt, 2_000_000, 0.32);
        m.observe(rtt, 30_000, 0.001);
        assert_eq!(m.link().map(|l| l.bytes_per_sec), Some(6.25e6));
        // A cold prompt paced by the cloud's prefill does not drag the estimate down.
        m.observe(rtt, 2_000_000, 2.0);
        assert_eq!(m.link().map(|l| l.bytes_per_sec), Some(6.25e6));
    }
}
