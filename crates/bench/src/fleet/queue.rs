//! Each server's queue while the load runs, from its `/metrics`: requests waiting for a batch
//! slot and sequences being computed (ours: `edgeprompt_queue_depth` and
//! `edgeprompt_active_sequences`; llama-server: `llamacpp:requests_deferred` and
//! `llamacpp:requests_processing`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::soak::samples::{gauge, metrics};

const EVERY: Duration = Duration::from_millis(250);

/// One server's queue over a rate's load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    pub samples: usize,
    pub mean_waiting: f64,
    pub max_waiting: u64,
    pub mean_running: f64,
    pub max_running: u64,
}

/// (waiting, running) in one exposition, ours or llama-server's.
fn read(text: &str) -> Option<(u64, u64)> {
    let pair = |w: &str, r: &str| Some((gauge(text, w)?, gauge(text, r)?));
    pair("edgeprompt_queue_depth", "edgeprompt_active_sequences")
        .or_else(|| pair("llamacpp:requests_deferred", "llamacpp:requests_processing"))
}

fn fold(seen: &[(u64, u64)]) -> Queue {
    let n = seen.len().max(1) as f64;
    Queue {
        samples: seen.len(),
        mean_waiting: seen.iter().map(|s| s.0 as f64).sum::<f64>() / n,
        max_waiting: seen.iter().map(|s| s.0).max().unwrap_or(0),
        mean_running: seen.iter().map(|s| s.1 as f64).sum::<f64>() / n,
        max_running: seen.iter().map(|s| s.1).max().unwrap_or(0),
    }
}

/// Samples every server (`http://host:port`, no `/v1`) until `stop` is set; one `Queue` per
/// server, `None` where no sample could be read.
pub async fn watch(servers: Vec<String>, stop: Arc<AtomicBool>) -> Vec<Option<Queue>> {
    let http = crate::http().build().unwrap_or_default();
    let mut seen = vec![Vec::new(); servers.len()];
    let mut tick = tokio::time::interval(EVERY);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        for (i, u) in servers.iter().enumerate() {
            if let Some(q) = metrics(&http, u).await.as_deref().and_then(read) {
                seen[i].push(q);
            }
        }
    }
    seen.iter()
        .map(|s| (!s.is_empty()).then(|| fold(s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ours_and_llama_servers() {
        let ours = "# HELP edgeprompt_queue_depth x\nedgeprompt_queue_depth 3\nedgeprompt_active_sequences 32\n";
        assert_eq!(read(ours), Some((3, 32)));
        let llama = "llamacpp:requests_processing 8\nllamacpp:requests_deferred 5\n";
        assert_eq!(read(llama), Some((5, 8)));
        assert_eq!(read("edgeprompt_queue_depth 3\n"), None);
    }

    #[test]
    fn folds_means_and_maxima() {
        let q = fold(&[(0, 2), (4, 6)]);
        assert_eq!((q.samples, q.max_waiting, q.max_running), (2, 4, 6));
        assert!((q.mean_waiting - 2.0).abs() < 1e-12 && (q.mean_running - 4.0).abs() < 1e-12);
    }
}
