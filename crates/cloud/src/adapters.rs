//! What this cloud serves edges running smaller models (CE-LSLM): adapter sets and fusers by
//! the edge model's fingerprint, the KV made for them so far, and the layouts they stream in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use edgeprompt_align::{AdapterSet, Fuser};
use edgeprompt_engine::{LayerKv, Model};
use tonic::Status;

use crate::stream::Layout;

/// A prompt's layers from the adapters' `min_split` on, in the small model's shape.
pub(crate) type MappedLayers = Arc<Vec<Arc<LayerKv>>>;

/// Adapter sets by the small model's fingerprint, and the mapped KV computed so far.
#[derive(Default)]
pub(crate) struct Adapters {
    pub(crate) sets: HashMap<String, Arc<AdapterSet>>,
    /// A small model's content address of a prompt -> prompt id. Consulted only for a request
    /// from a later layer: an edge asking for every layer wants exact KV, which this cloud
    /// (running the large model) does not have, so it gets "not found" and computes its own.
    pub(crate) by_address: HashMap<String, String>,
    /// (small model, prompt id) -> its layers from `min_split` on.
    pub(crate) mapped: Mutex<HashMap<(String, String), MappedLayers>>,
    /// Fusers by the small model's fingerprint.
    pub(crate) fusers: HashMap<String, Arc<Fused>>,
    /// (small model, prompt id) -> its fused KV, every layer.
    pub(crate) fused: Mutex<HashMap<(String, String), MappedLayers>>,
}

/// A fuser and the small model it serves (the cloud computes that model's exact KV too).
pub(crate) struct Fused {
    pub(crate) fuser: Fuser,
    pub(crate) slm: Arc<Model>,
    /// SHA-256 of the fuser file, hex: what headers and seals name.
    pub(crate) sha256: String,
}

impl Adapters {
    pub(crate) fn for_edge(&self, fingerprint: &str) -> Option<Arc<AdapterSet>> {
        self.sets.get(fingerprint).cloned()
    }

    pub(crate) fn fuser_for(&self, fingerprint: &str) -> Option<Arc<Fused>> {
        self.fusers.get(fingerprint).cloned()
    }

    /// Whether this cloud serves an edge of that model anything (mapped or fused KV).
    pub(crate) fn serves(&self, fingerprint: &str) -> bool {
        self.sets.contains_key(fingerprint) || self.fusers.contains_key(fingerprint)
    }
}

/// The small model's whole layout, fused by `f`.
pub(crate) fn fused_layout(f: &Fused) -> Layout {
    let mut layout = Layout::full(&f.slm);
    layout.fuser = Some(f.sha256.clone());
    layout
}

/// The small model's layout from `first` on; layers without an adapter cannot be served.
pub(crate) fn layout(set: &AdapterSet, first: u32) -> Result<Layout, Status> {
    let m = &set.meta;
    let layout = Layout {
        fingerprint: m.slm_fingerprint.clone(),
        n_layers: m.slm.n_layer,
        n_kv_head: m.slm.n_kv_head,
        head_dim: m.slm.head_dim,
        first_layer: 0,
        // Adapters map full-attention models: nothing is cut, nothing is recurrent, every
        // layer its own KV of one head size.
        windows: vec![None; m.slm.n_layer],
        mapped: true,
        recurrent: vec![false; m.slm.n_layer],
        state: None,
        layers: Default::default(),
        fuser: None,
    }
    .from_layer(first)?;
    if layout.first_layer < set.min_split() {
        return Err(Status::failed_precondition(format!(
            "layers below {} of the edge's model have no matched cloud layer: ask from there",
            set.min_split()
        )));
    }
    Ok(layout)
}
