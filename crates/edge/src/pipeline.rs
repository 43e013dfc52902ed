//! The edge's prefill against a cloud prefix that arrives layer by layer.

use std::sync::Arc;
use std::time::Instant;

use edgeprompt_engine::sequence::PrefillPass;
use edgeprompt_engine::{Model, PrefixKv, Sequence};
use tokio::sync::mpsc;

use crate::client::{CloudHeader, LayerArrival};
use crate::layer_stream::PromptKv;
use crate::{EdgeError, Result};

/// When one layer of a cold cloud prompt landed and this request's private layer ran
/// (seconds since the request was admitted).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct LayerTiming {
    pub layer: usize,
    pub arrived: f64,
    pub compute_start: f64,
    pub compute_end: f64,
    pub wire_bytes: usize,
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
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
/// When the stream starts at a later layer (CE-LSLM), the layers below it of the cloud prompt
/// are computed here first, while the deep layers load (CE-LSLM eq. 20).
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
    let first = header.first_layer.min(n);
    let mut queued = std::collections::VecDeque::new();
    if !pipeline {
        for _ in first..n {
            queued.push_back(recv(rx)?);
        }
    }
    if first > 0 {
        let mut local = PrefillPass::new(model, &header.token_ids, 0)?;
        for l in 0..first {
            local.run_layer(model, None)?;
            let done = Instant::now();
            pass.run_layer(model, Some(local.layer_kv(l)))?;
            timeline.layers.push(LayerTiming {
                layer: l,
                arrived: secs(done),
                compute_start: secs(done),
                compute_end: secs(Instant::now()),
                wire_bytes: 0,
            });
            layers.push(Arc::new(local.layer_kv(l).clone()));
        }
    }
    for l in first..n {
        let a = match queued.pop_front() {
            Some(a) => a,
            None => recv(rx)?,
        };
        if a.layer != l {
            return Err(EdgeError::Stream(format!(
                "layer {} arrived where {l} was due",
                a.layer
            )));
        }
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

/// Prefill the private `edge_ids` after a cloud prompt as the edge's lookup gives it: whole,
/// or still streaming (then layer `l` runs as soon as layer `l` has landed, verified; with
/// `pipeline` false, once the whole prompt is in). A fetch that fails mid-stream has been
/// replaced by the prompt computed here, bit for bit, so this only fails when the prompt
/// could not be had at all. Blocking: run it on a blocking thread.
pub fn prefill_following(
    model: &Model,
    kv: &PromptKv,
    edge_ids: &[u32],
    start: Instant,
    pipeline: bool,
) -> Result<(Sequence, Vec<f32>, Timeline)> {
    let secs = |t: Instant| t.saturating_duration_since(start).as_secs_f64();
    let failed = |e: crate::StreamFailure| EdgeError::Stream(e.message);
    let stream = match kv {
        PromptKv::Ready(prefix) => {
            let mut seq = Sequence::with_prefix(model, prefix.clone())?;
            let logits = seq.prefill(model, edge_ids)?;
            return Ok((seq, logits, Timeline::default()));
        }
        PromptKv::Streaming(s) => s,
    };
    if !pipeline {
        stream.wait_outcome().map_err(failed)?;
    }
    let mut pass = PrefillPass::new(model, edge_ids, stream.token_ids().len())?;
    let mut timeline = Timeline::default();
    for l in 0..model.cfg.n_layer {
        let landed = stream.wait_layer(l).map_err(failed)?;
        let t0 = Instant::now();
        pass.run_layer(model, Some(&landed.kv))?;
        timeline.layers.push(LayerTiming {
            layer: l,
            arrived: secs(landed.at),
            compute_start: secs(t0),
            compute_end: secs(Instant::now()),
            wire_bytes: landed.wire_bytes,
        });
    }
    let prefix = stream.wait_outcome().map_err(failed)?;
    let (seq, logits) = pass.finish(model, prefix)?;
    Ok((seq, logits, timeline))
}
