//! CE-LSLM serving: an edge running a smaller model of the same family asks with its own
//! fingerprint and a first layer; the cloud answers with the small model's KV for those layers,
//! mapped from its own KV through the adapters fitted by `edgeprompt align`.
//!
//! The adapters run here, not on the edge: the mapped KV has the small model's shape (for the
//! Qwen2.5 1.5B -> 0.5B pair, half the bytes per layer of the large model's KV), the mapping is
//! computed once per prompt and cached for every edge, and the edge spends its cycles on the
//! layers it computes itself. The prompt is public, so mapping it in the cloud reveals nothing.

use std::sync::Arc;

use edgeprompt_align::{AdapterSet, Fuser};
use edgeprompt_engine::Model;
use edgeprompt_kv::{content_address, Codec};
use edgeprompt_protocol::FetchMessage;
use tokio::sync::mpsc;
use tonic::Status;

use crate::adapters::{fused_layout, Fused, MappedLayers};
use crate::service::{CloudNode, Prompt};
use crate::stream::Layout;
use crate::CloudError;

impl CloudNode {
    /// Serve edges running the adapters' small model. Each set must be fitted for this
    /// node's model.
    pub fn with_adapters(mut self, sets: Vec<AdapterSet>) -> Result<Self, CloudError> {
        for set in sets {
            if set.meta.llm_fingerprint != self.model.fingerprint {
                return Err(CloudError::Adapters(format!(
                    "fitted for cloud model {}, this node runs {}",
                    short(&set.meta.llm_fingerprint),
                    short(&self.model.fingerprint)
                )));
            }
            tracing::info!(
                edge_model = short(&set.meta.slm_fingerprint),
                from_layer = set.min_split(),
                "CE-LSLM adapters loaded"
            );
            // Edges of that model find the prompts by the address they compute themselves (the
            // pair shares a tokenizer, so the token ids are the same).
            for p in self.prompts.values() {
                let address = content_address(&set.meta.slm_fingerprint, &p.token_ids);
                self.lslm.by_address.insert(address, p.id.clone());
            }
            self.lslm
                .sets
                .insert(set.meta.slm_fingerprint.clone(), Arc::new(set));
        }
        Ok(self)
    }

    /// Serve edges running the fuser's small model `slm` with its own KV fused with this
    /// node's. The fuser must be trained for this pair.
    pub fn with_fuser(mut self, slm: Arc<Model>, fuser: Fuser) -> Result<Self, CloudError> {
        let sha256 = fuser.sha256.clone();
        fuser
            .check(&self.model, &slm)
            .map_err(|e| CloudError::Adapters(e.to_string()))?;
        tracing::info!(
            edge_model = short(&slm.fingerprint),
            fuser = short(&sha256),
            layers = ?fuser.fused_layers(),
            "CE-LSLM fuser loaded"
        );
        for p in self.prompts.values() {
            let address = content_address(&slm.fingerprint, &p.token_ids);
            self.lslm.by_address.insert(address, p.id.clone());
        }
        self.lslm.fusers.insert(
            slm.fingerprint.clone(),
            Arc::new(Fused { fuser, slm, sha256 }),
        );
        Ok(self)
    }

    /// Every layer of the small model's KV of `p`, fused: computed once per prompt.
    pub(crate) async fn produce_fused(
        self: Arc<Self>,
        p: Arc<Prompt>,
        f: Arc<Fused>,
        codec: Codec,
        zstd: Option<i32>,
        tx: mpsc::Sender<Result<FetchMessage, Status>>,
    ) -> Result<(), Status> {
        let layout = fused_layout(&f);
        let address = content_address(&layout.fingerprint, &p.token_ids);
        let header =
            crate::stream::header(&layout, &p.id, &address, &p.token_ids, codec, zstd, None);
        tx.send(Ok(header))
            .await
            .map_err(|_| Status::cancelled("client went away"))?;
        let layers = self.fused_layers(&p, &f).await?;
        let manifest = crate::stream::manifest(&layout, &p.id, &p.token_ids, codec);
        for (j, layer) in layers.iter().enumerate() {
            let seal = self.layer_seal(&manifest);
            crate::stream::send_layer(&tx, j, layer, 0, codec, zstd, seal).await?;
        }
        Ok(())
    }

    async fn fused_layers(
        self: &Arc<Self>,
        p: &Arc<Prompt>,
        f: &Arc<Fused>,
    ) -> Result<MappedLayers, Status> {
        let key = (f.slm.fingerprint.clone(), p.id.clone());
        if let Some(hit) = self
            .lslm
            .fused
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(hit);
        }
        let kv = self.kv_of(p.clone()).await?;
        let (model, f2, ids) = (self.model.clone(), f.clone(), p.token_ids.clone());
        let layers = tokio::task::spawn_blocking(move || {
            let own = edgeprompt_align::conversation::prefix_of(&f2.slm, &ids)?;
            f2.fuser.fuse(&model, &f2.slm, &kv.layers, &own.layers)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(e.to_string()))?;
        let layers = Arc::new(layers.into_iter().map(Arc::new).collect::<Vec<_>>());
        if let Ok(mut m) = self.lslm.fused.lock() {
            m.insert(key, layers.clone());
        }
        tracing::info!(prompt = %p.id, "cloud prompt KV fused for a CE-LSLM edge");
        Ok(layers)
    }

    pub(crate) async fn produce_mapped(
        self: Arc<Self>,
        p: Arc<Prompt>,
        set: Arc<AdapterSet>,
        layout: Layout,
        codec: Codec,
        zstd: Option<i32>,
        tx: mpsc::Sender<Result<FetchMessage, Status>>,
    ) -> Result<(), Status> {
        // The address the edge would compute for this prompt with its own model.
        let address = content_address(&layout.fingerprint, &p.token_ids);
        let header =
            crate::stream::header(&layout, &p.id, &address, &p.token_ids, codec, zstd, None);
        tx.send(Ok(header))
            .await
            .map_err(|_| Status::cancelled("client went away"))?;
        let layers = self.mapped_layers(&p, &set).await?;
        let from = set.min_split();
        let manifest = crate::stream::manifest(&layout, &p.id, &p.token_ids, codec);
        for j in layout.first_layer..layout.n_layers {
            let seal = self.layer_seal(&manifest);
            crate::stream::send_layer(&tx, j, &layers[j - from], 0, codec, zstd, seal).await?;
        }
        Ok(())
    }

    async fn mapped_layers(
        self: &Arc<Self>,
        p: &Arc<Prompt>,
        set: &Arc<AdapterSet>,
    ) -> Result<MappedLayers, Status> {
        let key = (set.meta.slm_fingerprint.clone(), p.id.clone());
        if let Some(hit) = self
            .lslm
            .mapped
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return Ok(hit);
        }
        let kv = self.kv_of(p.clone()).await?;
        let (model, set2) = (self.model.clone(), set.clone());
        let layers = tokio::task::spawn_blocking(move || {
            (set2.min_split()..set2.meta.slm.n_layer)
                .map(|j| {
                    let i = set2
                        .llm_layer(j)
                        .ok_or_else(|| Status::internal(format!("no adapter for layer {j}")))?;
                    set2.map_layer(&model, j, &kv.layers[i])
                        .map(Arc::new)
                        .map_err(|e| Status::internal(e.to_string()))
                })
                .collect::<Result<Vec<_>, Status>>()
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))??;
        let layers = Arc::new(layers);
        if let Ok(mut m) = self.lslm.mapped.lock() {
            m.insert(key, layers.clone());
        }
        tracing::info!(prompt = %p.id, "cloud prompt KV mapped for a CE-LSLM edge");
        Ok(layers)
    }
}

fn short(fp: &str) -> &str {
    &fp[..fp.len().min(12)]
}
