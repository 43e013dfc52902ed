//! The edge's prefill against a cloud prefix that arrives layer by layer.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Model, PrefixKv, Sequence};
use tokio::sync::mpsc;

use crate::client::{CloudHeader, LayerArrival};
use crate::{EdgeError, Result};

/// Seconds since the request started.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerTiming {
    pub layer: usize,
    pub arrived: f64,
    pub compute_start: f64,
    pub compute_end: f64,
    pub wire_bytes: usize,
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timeline {
    pub layers: Vec<LayerTiming>,
}

impl Timeline {
    pub fn bytes_down(&self) -> usize {
        self.layers.iter().map(|l| l.wire_bytes).sum()
    }
}

/// Prefill the private `edge_ids` after the cloud prefix arriving on `rx`. With `pipeline`,
/// layer `l` runs as soon as cloud layer `l` is here; without, all layers are awaited first.
/// Blocking: run it on a blocking thread.
pub fn prefill_from_cloud(
    model: &Model,
    header: &CloudHeader,
    rx: &mut mpsc::Receiver<Result<LayerArrival>>,
    edge_ids: &[u32],
    start: Instant,
    pipeline: bool,
) -> Result<(Sequence, Vec<f32>, Timeline)> {
    let n = model.cfg.n_layer;
    let mut pass = PrefillPass::new(model, edge_ids, header.token_ids.len())?;
    let mut layers = Vec::with_capacity(n);
    let mut timeline = Timeline::default();
    let secs = |t: Instant| t.duration_since(start).as_secs_f64();
    let recv = |rx: &mut mpsc::Receiver<Result<LayerArrival>>| -> Result<LayerArrival> {
        rx.blocking_recv()
            .ok_or_else(|| EdgeError::Stream("cloud stream closed early".into()))?
    };
    let mut queued = std::collections::VecDeque::new();
    if !pipeline {
        for _ in 0..n {
            queued.push_back(recv(rx)?);
        }
    }
    for _ in 0..n {
        let a = match queued.pop_front() {
            Some(a) => a,
            None => recv(rx)?,
        };
        let t0 = Instant::now();
        pass.run_layer(model, Some(&a.kv))?;
        timeline.layers.push(LayerTiming {
            layer: a.layer,
            arrived: secs(a.at),
            compute_start: secs(t0),
            compute_end: secs(Instant::now()),
            wire_bytes: a.wire_bytes,
        });
        layers.push(Arc::new(a.kv));
    }
    let prefix = Arc::new(PrefixKv {
        fingerprint: model.fingerprint.clone(),
        token_ids: header.token_ids.clone(),
        layers,
    });
    let (seq, logits) = pass.finish(model, prefix)?;
    Ok((seq, logits, timeline))
}
